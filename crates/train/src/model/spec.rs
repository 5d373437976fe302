//! The data that describes a model: layers, their operations and their parameters.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

/// How a parameter is initialised.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Init {
    /// Uniform in `[-bound, bound]`.
    Uniform {
        /// Half-width of the interval.
        bound: f32,
    },
    /// All zeros.
    Zeros,
    /// All ones.
    Ones,
}

/// One parameter tensor of a layer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ParamSpec {
    /// Name within the layer (`weight`, `bias`, `bn1.gamma`, ...).
    pub name: String,
    /// Logical shape (the engine stores every parameter flat).
    pub shape: Vec<usize>,
    /// Initialiser.
    pub init: Init,
}

impl ParamSpec {
    /// Number of scalar values.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// What a layer computes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum LayerOp {
    /// Convolution (bias unless batch-normalised) -> optional batch norm -> ReLU ->
    /// optional 2x2 max-pool.
    Conv {
        /// Input channels.
        in_channels: usize,
        /// Output channels.
        out_channels: usize,
        /// Square kernel side.
        kernel: usize,
        /// Stride.
        stride: usize,
        /// Zero padding on each side.
        padding: usize,
        /// Batch norm after the convolution (then the convolution has no bias).
        batch_norm: bool,
        /// 2x2 max-pool with stride 2 at the end.
        pool: bool,
    },
    /// Flatten (if the input is an image) -> fully connected -> optional ReLU.
    Linear {
        /// Input features.
        in_features: usize,
        /// Output features.
        out_features: usize,
        /// ReLU after the product.
        relu: bool,
    },
    /// ResNet basic block: conv3x3-BN-ReLU-conv3x3-BN, plus a parameter-free shortcut
    /// (subsample and zero-pad channels when the shape changes: "option A"), then ReLU.
    BasicBlock {
        /// Input channels.
        in_channels: usize,
        /// Output channels.
        out_channels: usize,
        /// Stride of the first convolution (and of the shortcut).
        stride: usize,
    },
    /// Global average pool -> fully connected (the classifier head of ResNets).
    PoolLinear {
        /// Channels pooled.
        in_channels: usize,
        /// Output features.
        out_features: usize,
    },
    /// A layer of a compute profile: its compute is replayed by waiting, not computed
    /// (see [`crate::engine::ProfileEngine`]).
    Profiled {
        /// Forward time, nanoseconds.
        forward_ns: u64,
        /// Backward time, nanoseconds.
        backward_ns: u64,
    },
}

/// One layer: the unit of forward/backward segmentation.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LayerSpec {
    /// Human-readable name (`conv1`, `fc2`, `stage2.block1`).
    pub name: String,
    /// The computation.
    pub op: LayerOp,
    /// Parameters in key order.
    pub params: Vec<ParamSpec>,
    /// Shape of one sample's output (`[C, H, W]` or `[F]`).
    pub output_shape: Vec<usize>,
}

/// One parameter tensor as the synchronisation layer sees it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KeySpec {
    /// Key number: position from the input over all layers' parameters.
    pub key: usize,
    /// The layer that owns it.
    pub layer: usize,
    /// `layer_name.param_name`.
    pub name: String,
    /// Logical shape.
    pub shape: Vec<usize>,
    /// Scalar values.
    pub numel: usize,
}

/// A whole model: an ordered list of layers over a known input.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSpec {
    /// Model name (`lenet`, ...).
    pub name: String,
    /// Input shape `[C, H, W]`.
    pub input: [usize; 3],
    /// Number of classes.
    pub classes: usize,
    /// Layers from the input.
    pub layers: Vec<LayerSpec>,
}

impl ModelSpec {
    /// A model replayed from a compute profile: one layer per profiled node, one key per
    /// node with parameters.
    pub fn from_profile(profile: &syncopate_core::profile::ModelProfile) -> Self {
        let layers = profile
            .layers
            .iter()
            .map(|l| LayerSpec {
                name: l.name.clone(),
                op: LayerOp::Profiled {
                    forward_ns: l.forward_ns,
                    backward_ns: l.backward_ns,
                },
                params: Self::profiled_params(&l.tensor_sizes()),
                output_shape: Vec::new(),
            })
            .collect();
        Self {
            name: format!("profile:{}", profile.name),
            input: [1, 1, 1],
            classes: 1,
            layers,
        }
    }

    /// A profiled layer's parameter tensors: `params` for a single one (as profiles without
    /// tensor sizes have), `params0`, `params1`, ... for several.
    fn profiled_params(sizes: &[usize]) -> Vec<ParamSpec> {
        let name = |i: usize| match sizes.len() {
            1 => "params".to_string(),
            _ => format!("params{i}"),
        };
        let params = sizes.iter().enumerate().map(|(i, &numel)| ParamSpec {
            name: name(i),
            shape: vec![numel],
            init: Init::Uniform { bound: 0.01 },
        });
        params.collect()
    }

    /// Whether the model is a compute profile (replayed, not trained).
    pub fn is_profile(&self) -> bool {
        self.layers
            .iter()
            .any(|l| matches!(l.op, LayerOp::Profiled { .. }))
    }

    /// Every parameter tensor, numbered from the input.
    pub fn keys(&self) -> Vec<KeySpec> {
        let mut keys = Vec::new();
        for (layer, spec) in self.layers.iter().enumerate() {
            for p in &spec.params {
                keys.push(KeySpec {
                    key: keys.len(),
                    layer,
                    name: format!("{}.{}", spec.name, p.name),
                    shape: p.shape.clone(),
                    numel: p.numel(),
                });
            }
        }
        keys
    }

    /// The keys owned by each layer, as ranges of key numbers.
    pub fn layer_keys(&self) -> Vec<std::ops::Range<usize>> {
        let mut start = 0;
        self.layers
            .iter()
            .map(|l| {
                let r = start..start + l.params.len();
                start = r.end;
                r
            })
            .collect()
    }

    /// Total scalar parameters.
    pub fn num_params(&self) -> usize {
        self.layers
            .iter()
            .flat_map(|l| &l.params)
            .map(ParamSpec::numel)
            .sum()
    }

    /// A short stable fingerprint of the architecture (names and shapes), for checking that
    /// peers and checkpoints agree on the model.
    pub fn fingerprint(&self) -> u64 {
        // FNV-1a over the key names and shapes: stable across platforms and releases.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for &b in bytes {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        };
        eat(self.name.as_bytes());
        for k in self.keys() {
            eat(k.name.as_bytes());
            for d in &k.shape {
                eat(&(*d as u64).to_le_bytes());
            }
        }
        h
    }

    /// Initial values of every key, deterministic in `seed` (each key has its own stream, so
    /// the values of one key do not depend on the sizes of the others).
    pub fn init_params(&self, seed: u64) -> Vec<Vec<f32>> {
        self.layers
            .iter()
            .flat_map(|l| &l.params)
            .enumerate()
            .map(|(key, p)| {
                let n = p.numel();
                match p.init {
                    Init::Zeros => vec![0.0; n],
                    Init::Ones => vec![1.0; n],
                    Init::Uniform { bound } => {
                        let mut rng = ChaCha8Rng::seed_from_u64(
                            seed ^ (key as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
                        );
                        (0..n).map(|_| rng.gen_range(-bound..=bound)).collect()
                    }
                }
            })
            .collect()
    }
}

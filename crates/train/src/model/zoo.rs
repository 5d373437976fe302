//! The built-in models: `mlp`, `lenet`, `resnet20` and `vgg-mini`.

use super::spec::{Init, LayerOp, LayerSpec, ModelSpec, ParamSpec};
use crate::error::{Result, TrainError};

/// Names accepted by [`build`].
pub const MODEL_NAMES: [&str; 4] = ["mlp", "lenet", "resnet20", "vgg-mini"];

/// Builds the named model for inputs of `input` shape `[C, H, W]` and `classes` outputs.
pub fn build(name: &str, input: [usize; 3], classes: usize) -> Result<ModelSpec> {
    let mut b = Builder::new(input);
    match name {
        // A plain multi-layer perceptron.
        "mlp" => {
            b.linear("fc1", 512, true)?;
            b.linear("fc2", 256, true)?;
            b.linear("fc3", classes, false)?;
        }
        // PyTorch's MNIST example shape: conv 1->32 3x3, relu, pool, conv 32->64 3x3, relu,
        // pool, fc 1600->128, relu, fc 128->10.
        "lenet" => {
            b.conv3x3("conv1", 32, 0, false, true)?;
            b.conv3x3("conv2", 64, 0, false, true)?;
            b.linear("fc1", 128, true)?;
            b.linear("fc2", classes, false)?;
        }
        // He et al.'s CIFAR ResNet-20: 3 stages of 3 basic blocks (16, 32, 64 channels).
        "resnet20" => {
            b.conv3x3("stem", 16, 1, true, false)?;
            for (stage, channels) in [16usize, 32, 64].into_iter().enumerate() {
                for block in 0..3 {
                    let stride = if stage > 0 && block == 0 { 2 } else { 1 };
                    b.basic_block(
                        &format!("stage{}.block{}", stage + 1, block + 1),
                        channels,
                        stride,
                    )?;
                }
            }
            b.pool_linear("fc", classes)?;
        }
        // VGG-style: small convolutions, then large fully-connected layers near the output,
        // so that most bytes belong to the last layers, as in VGG-19.
        "vgg-mini" => {
            b.conv3x3("conv1", 32, 1, false, false)?;
            b.conv3x3("conv2", 32, 1, false, true)?;
            b.conv3x3("conv3", 64, 1, false, false)?;
            b.conv3x3("conv4", 64, 1, false, true)?;
            b.linear("fc1", 512, true)?;
            b.linear("fc2", 512, true)?;
            b.linear("fc3", classes, false)?;
        }
        other => {
            return Err(TrainError::Model(format!(
                "unknown model '{other}'; known models: {}",
                MODEL_NAMES.join(", ")
            )))
        }
    }
    Ok(ModelSpec {
        name: name.into(),
        input,
        classes,
        layers: b.layers,
    })
}

/// Tracks the running output shape while layers are appended.
struct Builder {
    shape: Vec<usize>,
    layers: Vec<LayerSpec>,
}

fn weight_bound(fan_in: usize) -> Init {
    // He (Kaiming) uniform for ReLU networks.
    Init::Uniform {
        bound: (6.0 / fan_in as f32).sqrt(),
    }
}

fn bias_bound(fan_in: usize) -> Init {
    Init::Uniform {
        bound: 1.0 / (fan_in as f32).sqrt(),
    }
}

/// A batch norm's parameters over `channels`: `<prefix>.gamma` (ones) and `<prefix>.beta`
/// (zeros).
fn batch_norm_params(prefix: &str, channels: usize) -> [ParamSpec; 2] {
    [
        param(&format!("{prefix}.gamma"), &[channels], Init::Ones),
        param(&format!("{prefix}.beta"), &[channels], Init::Zeros),
    ]
}

fn param(name: &str, shape: &[usize], init: Init) -> ParamSpec {
    ParamSpec {
        name: name.into(),
        shape: shape.to_vec(),
        init,
    }
}

impl Builder {
    fn new(input: [usize; 3]) -> Self {
        Self {
            shape: input.to_vec(),
            layers: Vec::new(),
        }
    }

    fn image_shape(&self, layer: &str) -> Result<[usize; 3]> {
        match self.shape[..] {
            [c, h, w] => Ok([c, h, w]),
            _ => Err(TrainError::Model(format!(
                "layer {layer} needs an image input, got features {:?}",
                self.shape
            ))),
        }
    }

    /// A 3x3 convolution with stride 1 (every plain convolution of the built-in models;
    /// the residual blocks build their own), then the batch norm or bias, and the pool.
    fn conv3x3(
        &mut self,
        name: &str,
        out_channels: usize,
        padding: usize,
        batch_norm: bool,
        pool: bool,
    ) -> Result<()> {
        let (kernel, stride) = (3, 1);
        let [c, h, w] = self.image_shape(name)?;
        let out = |x: usize| {
            (x + 2 * padding)
                .checked_sub(kernel)
                .map(|v| v / stride + 1)
        };
        let (Some(mut oh), Some(mut ow)) = (out(h), out(w)) else {
            return Err(TrainError::Model(format!(
                "layer {name}: a {kernel}x{kernel} kernel does not fit a {h}x{w} input"
            )));
        };
        if pool {
            (oh, ow) = (oh / 2, ow / 2);
        }
        if oh == 0 || ow == 0 {
            return Err(TrainError::Model(format!(
                "layer {name}: the input {h}x{w} is too small for this model"
            )));
        }
        let fan_in = c * kernel * kernel;
        let mut params = vec![param(
            "weight",
            &[out_channels, c, kernel, kernel],
            weight_bound(fan_in),
        )];
        if batch_norm {
            params.extend(batch_norm_params("bn", out_channels));
        } else {
            params.push(param("bias", &[out_channels], bias_bound(fan_in)));
        }
        self.push(
            name,
            LayerOp::Conv {
                in_channels: c,
                out_channels,
                kernel,
                stride,
                padding,
                batch_norm,
                pool,
            },
            params,
            vec![out_channels, oh, ow],
        );
        Ok(())
    }

    fn linear(&mut self, name: &str, out_features: usize, relu: bool) -> Result<()> {
        let in_features: usize = self.shape.iter().product();
        // The classifier (no ReLU after it) gets PyTorch's default, smaller bound.
        let init = if relu {
            weight_bound(in_features)
        } else {
            bias_bound(in_features)
        };
        self.push(
            name,
            LayerOp::Linear {
                in_features,
                out_features,
                relu,
            },
            vec![
                param("weight", &[in_features, out_features], init),
                param("bias", &[out_features], bias_bound(in_features)),
            ],
            vec![out_features],
        );
        Ok(())
    }

    fn basic_block(&mut self, name: &str, out_channels: usize, stride: usize) -> Result<()> {
        let [c, h, w] = self.image_shape(name)?;
        let (oh, ow) = (h.div_ceil(stride), w.div_ceil(stride));
        let conv1 = c * 9;
        let conv2 = out_channels * 9;
        let [gamma1, beta1] = batch_norm_params("bn1", out_channels);
        let [gamma2, beta2] = batch_norm_params("bn2", out_channels);
        self.push(
            name,
            LayerOp::BasicBlock {
                in_channels: c,
                out_channels,
                stride,
            },
            vec![
                param(
                    "conv1.weight",
                    &[out_channels, c, 3, 3],
                    weight_bound(conv1),
                ),
                gamma1,
                beta1,
                param(
                    "conv2.weight",
                    &[out_channels, out_channels, 3, 3],
                    weight_bound(conv2),
                ),
                gamma2,
                beta2,
            ],
            vec![out_channels, oh, ow],
        );
        Ok(())
    }

    fn pool_linear(&mut self, name: &str, out_features: usize) -> Result<()> {
        let [c, _, _] = self.image_shape(name)?;
        self.push(
            name,
            LayerOp::PoolLinear {
                in_channels: c,
                out_features,
            },
            vec![
                param("weight", &[c, out_features], bias_bound(c)),
                param("bias", &[out_features], bias_bound(c)),
            ],
            vec![out_features],
        );
        Ok(())
    }

    fn push(&mut self, name: &str, op: LayerOp, params: Vec<ParamSpec>, output_shape: Vec<usize>) {
        self.shape = output_shape.clone();
        self.layers.push(LayerSpec {
            name: name.into(),
            op,
            params,
            output_shape,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lenet_has_the_pytorch_example_shape() {
        let m = build("lenet", [1, 28, 28], 10).unwrap();
        let shapes: Vec<Vec<usize>> = m.keys().into_iter().map(|k| k.shape).collect();
        assert_eq!(
            shapes,
            vec![
                vec![32, 1, 3, 3],
                vec![32],
                vec![64, 32, 3, 3],
                vec![64],
                vec![1600, 128],
                vec![128],
                vec![128, 10],
                vec![10]
            ]
        );
        assert_eq!(m.num_params(), 225_034);
    }

    #[test]
    fn resnet20_has_its_published_size() {
        let m = build("resnet20", [3, 32, 32], 10).unwrap();
        // 0.27 M parameters (He et al. 2016, table 6; 269,722 with the option-A shortcut).
        assert_eq!(m.num_params(), 269_722);
        assert_eq!(m.layers.last().unwrap().output_shape, vec![10]);
    }

    #[test]
    fn vgg_mini_puts_most_bytes_near_the_output() {
        let m = build("vgg-mini", [3, 32, 32], 10).unwrap();
        let keys = m.keys();
        let last_two_layers: usize = keys
            .iter()
            .filter(|k| k.layer >= m.layers.len() - 3)
            .map(|k| k.numel)
            .sum();
        assert!(last_two_layers as f64 > 0.9 * m.num_params() as f64);
    }

    #[test]
    fn unknown_model_and_too_small_input_are_errors() {
        assert!(build("resnet50", [3, 32, 32], 10)
            .unwrap_err()
            .to_string()
            .contains("known models"));
        assert!(build("lenet", [1, 4, 4], 10).is_err());
    }

    #[test]
    fn keys_are_numbered_from_the_input_and_init_is_seeded() {
        let m = build("mlp", [1, 28, 28], 10).unwrap();
        let keys = m.keys();
        assert!(keys
            .windows(2)
            .all(|w| w[0].key + 1 == w[1].key && w[0].layer <= w[1].layer));
        assert_eq!(m.layer_keys(), vec![0..2, 2..4, 4..6]);
        assert_eq!(m.init_params(1), m.init_params(1));
        assert_ne!(m.init_params(1), m.init_params(2));
        assert_ne!(
            m.fingerprint(),
            build("lenet", [1, 28, 28], 10).unwrap().fingerprint()
        );
    }
}

//! `syncopate._native`, the native side of the `syncopate` Python package: a handle on a
//! job of Syncopate's runtime ([`syncopate_runtime::collective::Ring`]) that a PyTorch
//! training loop all-reduces its buffers over. It only translates between Python and the
//! runtime; what moves on the wire, the rendezvous, the authentication and the liveness
//! rules are the runtime's and core's. It also reads compute profiles with core's parser
//! ([`profile`]).

mod profile;

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use syncopate_core::liveness::LivenessConfig;
use syncopate_core::strategy::{OuterNesterov, OuterOptions};
use syncopate_core::wire::halves::{narrow, widen};
use syncopate_core::wire::WireFloat;
use syncopate_runtime::auth::JobToken;
use syncopate_runtime::collective::{Operation, Ring as RuntimeRing};
use syncopate_runtime::comm::CommOptions;
use syncopate_runtime::job::ProcessContext;
use syncopate_runtime::process::local_ip_towards;

/// A ring of `world_size` processes all-reducing float32, float16 and bfloat16 buffers
/// (accumulated in float32) over Syncopate's links.
#[pyclass(module = "syncopate._native", name = "Ring")]
struct Ring {
    ring: RuntimeRing,
}

/// Resolves `host:port` to one socket address (the rendezvous's).
fn resolve(host: &str, port: u16) -> PyResult<SocketAddr> {
    (host, port)
        .to_socket_addrs()
        .map_err(|e| PyValueError::new_err(format!("cannot resolve {host}:{port}: {e}")))?
        .next()
        .ok_or_else(|| PyValueError::new_err(format!("{host}:{port} has no address")))
}

/// Seconds from Python as a duration, refusing what is not a positive finite number.
fn seconds(name: &str, value: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(value)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| PyValueError::new_err(format!("{name} must be > 0 seconds, got {value}")))
}

/// The element types a buffer may have: float32, or float16/bfloat16, accumulated in
/// float32 (converted as they are read and written) and sent as they are (half the bytes).
#[derive(Debug, Clone, Copy)]
enum Dtype {
    F32,
    F16,
    Bf16,
}

impl Dtype {
    fn parse(name: &str) -> PyResult<Self> {
        match name {
            "float32" => Ok(Self::F32),
            "float16" => Ok(Self::F16),
            "bfloat16" => Ok(Self::Bf16),
            other => Err(PyValueError::new_err(format!(
                "syncopate all-reduces float32, float16 and bfloat16 buffers, not {other}"
            ))),
        }
    }
}

/// One all-reduce of memory the Python side owns (a contiguous CPU tensor's), read and
/// written in place on the ring's communication thread, without the GIL; `done(error)` is
/// then called with the GIL.
struct TensorOperation {
    /// The first element's address.
    address: usize,
    numel: usize,
    dtype: Dtype,
    done: PyObject,
}

impl Operation for TensorOperation {
    fn len(&self) -> usize {
        self.numel
    }

    fn read(&self, into: &mut [f32]) {
        let n = self.numel.min(into.len());
        // SAFETY: the Python side (`SyncopateState.allreduce`) passes the address of a
        // contiguous CPU tensor of `numel` elements of `dtype`, and keeps that tensor alive
        // and untouched until `done` has been called.
        unsafe {
            match self.wire_float() {
                WireFloat::F32 => {
                    std::ptr::copy_nonoverlapping(self.address as *const f32, into.as_mut_ptr(), n)
                }
                float => {
                    let bits = std::slice::from_raw_parts(self.address as *const u16, n);
                    widen(bits, float, &mut into[..n]);
                }
            }
        }
    }

    fn wire_float(&self) -> WireFloat {
        match self.dtype {
            Dtype::F32 => WireFloat::F32,
            Dtype::F16 => WireFloat::F16,
            Dtype::Bf16 => WireFloat::Bf16,
        }
    }

    fn complete(self: Box<Self>, result: Result<&[f32], String>) {
        let error = match result {
            Ok(values) => {
                let n = self.numel.min(values.len());
                // SAFETY: as in `read`; nothing else touches the tensor until `done`.
                unsafe {
                    match self.wire_float() {
                        WireFloat::F32 => std::ptr::copy_nonoverlapping(
                            values.as_ptr(),
                            self.address as *mut f32,
                            n,
                        ),
                        float => {
                            let bits = std::slice::from_raw_parts_mut(self.address as *mut u16, n);
                            narrow(&values[..n], float, bits);
                        }
                    }
                }
                None
            }
            Err(e) => Some(e),
        };
        Python::with_gil(|py| {
            if let Err(e) = self.done.call1(py, (error,)) {
                // Nobody on this thread can take the exception: print it, as Python does
                // for an exception in a thread.
                e.print(py);
            }
        });
    }
}

#[pymethods]
impl Ring {
    /// Joins the job: rank 0 hosts the rendezvous on `master_addr:port`; every rank
    /// authenticates with the job token (64 hex digits) and links to its ring neighbours,
    /// accepting links on `bind_addr` (default: the local address that routes to
    /// `master_addr`).
    /// Blocks (without the GIL) until the ring is formed or `connect_timeout` has passed.
    /// A peer silent for `peer_timeout` seconds fails the job, naming it (the ring's own
    /// thread sends heartbeats, so a process busy elsewhere is never silent); an operation
    /// not complete `collective_timeout` seconds after it started fails it too.
    /// `frame_mac` tags every frame under the job's keys (every rank must agree; off only
    /// on a network where nobody else can send or alter packets: it then authenticates the
    /// handshake alone, as Gloo authenticates nothing).
    #[new]
    #[pyo3(signature = (rank, world_size, master_addr, port, token, peer_timeout=30.0, connect_timeout=120.0, bind_addr=None, collective_timeout=1800.0, frame_mac=true))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        rank: usize,
        world_size: usize,
        master_addr: &str,
        port: u16,
        token: &str,
        peer_timeout: f64,
        connect_timeout: f64,
        bind_addr: Option<&str>,
        collective_timeout: f64,
        frame_mac: bool,
    ) -> PyResult<Self> {
        let collective_timeout = seconds("collective_timeout", collective_timeout)?;
        let coordinator = resolve(master_addr, port)?;
        let bind_ip: IpAddr = match bind_addr {
            Some(addr) => addr
                .parse()
                .map_err(|e| PyValueError::new_err(format!("bind_addr {addr:?}: {e}")))?,
            None => local_ip_towards(coordinator),
        };
        let peer_timeout = seconds("peer_timeout", peer_timeout)?;
        let ctx = ProcessContext {
            rank,
            token: JobToken::from_hex(token)
                .map_err(|e| PyValueError::new_err(format!("job token: {e}")))?,
            coordinator,
            host_coordinator: rank == 0,
            bind_ip,
            connect_timeout: seconds("connect_timeout", connect_timeout)?,
            comm: CommOptions {
                liveness: LivenessConfig::default()
                    .with_peer_timeout(u64::try_from(peer_timeout.as_nanos()).unwrap_or(u64::MAX)),
                frame_mac,
                ..CommOptions::default()
            },
            metrics: None,
        };
        let ring = py
            .allow_threads(|| RuntimeRing::join_with_timeout(&ctx, world_size, collective_timeout))
            .map_err(|e| PyRuntimeError::new_err(format!("syncopate: joining the ring: {e}")))?;
        Ok(Self { ring })
    }

    /// This process's rank.
    #[getter]
    fn rank(&self) -> usize {
        self.ring.rank()
    }

    /// Processes in the ring.
    #[getter]
    fn world_size(&self) -> usize {
        self.ring.workers()
    }

    /// The error that ended the job (it names the peer), or None.
    fn failure(&self) -> Option<String> {
        self.ring.failure()
    }

    /// Starts the average over every rank of the `numel` values of type `dtype`
    /// ("float32", "float16" or "bfloat16") at `address`, at once, beside the operations
    /// in flight. The values are read and the average written back in place on the ring's
    /// communication thread, without the GIL; then `done(error)` is called there, with the
    /// GIL: `error` is None, or the job's error (it names the peer). The caller must keep
    /// the memory (a contiguous CPU tensor's) alive and untouched until `done` is called.
    /// Every rank must start buffers of the same lengths in the same order.
    fn allreduce(&self, address: usize, numel: usize, dtype: &str, done: PyObject) -> PyResult<()> {
        let dtype = Dtype::parse(dtype)?;
        if address == 0 && numel > 0 {
            return Err(PyValueError::new_err("a null address"));
        }
        self.ring.start(Box::new(TensorOperation {
            address,
            numel,
            dtype,
            done,
        }));
        Ok(())
    }

    /// Test-only: makes the ring's communication thread panic with `message` once it
    /// reaches this request; every pending and queued operation must then fail with it.
    fn _inject_panic(&self, message: String) {
        self.ring.inject_panic(message);
    }

    /// Finishes the queued operations and closes the links (without the GIL: the
    /// communication thread may need it to complete them).
    fn close(&mut self, py: Python<'_>) {
        let ring = &mut self.ring;
        py.allow_threads(|| ring.close());
    }
}

impl Drop for Ring {
    /// A ring dropped unclosed (garbage collected, with the GIL held) closes without the
    /// GIL, which its communication thread may need to complete what is queued.
    fn drop(&mut self) {
        if self.ring.is_closed() {
            return;
        }
        let ring = &mut self.ring;
        Python::with_gil(|py| py.allow_threads(|| ring.close()));
    }
}

/// DiLoCo's outer optimizer (core's [`OuterNesterov`], the very arithmetic of
/// `syncopate launch --strategy diloco`) over one flat float32 buffer of a model's
/// parameters: the anchor (the weights of the last outer step) and the Nesterov momentum.
/// Buffers are given as the addresses of contiguous float32 CPU tensors of `numel`
/// values, which the caller keeps alive during the call.
#[pyclass(module = "syncopate._native", name = "OuterNesterov")]
struct Outer {
    inner: OuterNesterov,
    numel: usize,
}

/// The `numel` float32 values at `address`.
///
/// # Safety
/// `address` must point at `numel` float32 values that stay valid, and that nothing else
/// writes, while the slice lives.
unsafe fn floats<'a>(address: usize, numel: usize) -> PyResult<&'a mut [f32]> {
    if address == 0 || !address.is_multiple_of(std::mem::align_of::<f32>()) {
        return Err(PyValueError::new_err(format!(
            "not the address of float32 values: {address:#x}"
        )));
    }
    // SAFETY: the caller's promise (see above); the address is non-null and aligned.
    Ok(unsafe { std::slice::from_raw_parts_mut(address as *mut f32, numel) })
}

#[pymethods]
impl Outer {
    /// An outer optimizer over `numel` values with learning rate `lr` and Nesterov
    /// momentum `momentum` (refused: lr <= 0, momentum outside [0, 1)); its anchor is zero
    /// until [`Outer::set_anchor`].
    #[new]
    fn new(numel: usize, lr: f32, momentum: f32) -> PyResult<Self> {
        let options = OuterOptions { lr, momentum };
        options.validate().map_err(PyValueError::new_err)?;
        Ok(Self {
            inner: OuterNesterov::new(&[numel], options),
            numel,
        })
    }

    /// The number of values.
    #[getter]
    fn numel(&self) -> usize {
        self.numel
    }

    /// Sets the anchor to the values at `address` (the job's initial weights).
    fn set_anchor(&mut self, address: usize) -> PyResult<()> {
        // SAFETY: the Python wrapper passes a live contiguous float32 tensor of `numel`.
        let weights = unsafe { floats(address, self.numel)? };
        self.inner.set_anchor(0, weights);
        Ok(())
    }

    /// Replaces the weights at `address` with the outer gradient `anchor - weights`.
    fn outer_gradient(&self, address: usize) -> PyResult<()> {
        // SAFETY: as in `set_anchor`.
        let buffer = unsafe { floats(address, self.numel)? };
        let weights = buffer.to_vec();
        self.inner.outer_gradient(0, &weights, buffer);
        Ok(())
    }

    /// The outer step with the workers' mean outer gradient at `address`, which is then
    /// replaced by the new anchor (the weights every worker goes on from).
    fn step(&mut self, address: usize) -> PyResult<()> {
        // SAFETY: as in `set_anchor`.
        let buffer = unsafe { floats(address, self.numel)? };
        let mean = buffer.to_vec();
        let anchor = self.inner.step(0, &mean);
        buffer.copy_from_slice(anchor);
        Ok(())
    }

    /// Copies the anchor and the momentum into the buffers at the two addresses (what a
    /// checkpoint keeps).
    fn state_into(&self, anchor: usize, momentum: usize) -> PyResult<()> {
        let state = self.inner.state();
        for (address, values) in [anchor, momentum].into_iter().zip(&state) {
            // SAFETY: as in `set_anchor`.
            unsafe { floats(address, self.numel)? }.copy_from_slice(values);
        }
        Ok(())
    }

    /// Restores the anchor and the momentum from the buffers at the two addresses.
    fn restore_from(&mut self, anchor: usize, momentum: usize) -> PyResult<()> {
        // SAFETY: as in `set_anchor`.
        let state = unsafe {
            vec![
                floats(anchor, self.numel)?.to_vec(),
                floats(momentum, self.numel)?.to_vec(),
            ]
        };
        self.inner.restore(state).map_err(PyValueError::new_err)
    }
}

/// A fresh job token: 64 hex digits from the operating system's random source.
#[pyfunction]
fn new_token() -> String {
    JobToken::generate().to_hex()
}

/// The native module: `Ring`, `OuterNesterov`, `new_token`, `parse_profile` and
/// `ProfileError`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Ring>()?;
    m.add_class::<Outer>()?;
    m.add_function(wrap_pyfunction!(new_token, m)?)?;
    m.add_function(wrap_pyfunction!(profile::parse_profile, m)?)?;
    m.add("ProfileError", m.py().get_type::<profile::ProfileError>())?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

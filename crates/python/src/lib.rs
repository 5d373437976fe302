//! `syncopate._native`, the native side of the `syncopate` Python package: a handle on a
//! job of Syncopate's runtime ([`syncopate_runtime::collective::Ring`]) that a PyTorch
//! training loop all-reduces its buffers over. It only translates between Python and the
//! runtime; what moves on the wire, the rendezvous, the authentication and the liveness
//! rules are the runtime's and core's.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use syncopate_core::liveness::LivenessConfig;
use syncopate_runtime::auth::JobToken;
use syncopate_runtime::collective::Ring as RuntimeRing;
use syncopate_runtime::comm::CommOptions;
use syncopate_runtime::job::ProcessContext;
use syncopate_runtime::process::local_ip_towards;

/// A ring of `world_size` processes all-reducing float32 buffers over Syncopate's links.
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

/// Little-endian float32 bytes as values (a trailing partial value is refused).
fn values_of(bytes: &[u8]) -> PyResult<Vec<f32>> {
    let (whole, rest) = bytes.as_chunks::<4>();
    if !rest.is_empty() {
        return Err(PyValueError::new_err(format!(
            "a buffer of {} bytes is not a whole number of float32 values",
            bytes.len()
        )));
    }
    Ok(whole.iter().map(|b| f32::from_le_bytes(*b)).collect())
}

/// Values as little-endian float32 bytes.
fn bytes_of(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

#[pymethods]
impl Ring {
    /// Joins the job: rank 0 hosts the rendezvous on `master_addr:port`; every rank
    /// authenticates with the job token (64 hex digits) and links to its ring neighbours,
    /// accepting links on `bind_addr` (default: the local address that routes to
    /// `master_addr`).
    /// Blocks (without the GIL) until the ring is formed or `connect_timeout` has passed.
    /// A peer silent for `peer_timeout` seconds fails the job, naming it.
    #[new]
    #[pyo3(signature = (rank, world_size, master_addr, port, token, peer_timeout=30.0, connect_timeout=120.0, bind_addr=None))]
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
    ) -> PyResult<Self> {
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
                ..CommOptions::default()
            },
            metrics: None,
        };
        let ring = py
            .allow_threads(|| RuntimeRing::join(&ctx, world_size))
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

    /// Queues the average over every rank of `data` (float32, little-endian bytes);
    /// `done(result, error)` is then called on the ring's communication thread, holding
    /// the GIL, with the averaged bytes and None, or None and the job's error. Every rank
    /// must queue buffers of the same lengths in the same order.
    fn allreduce(&self, data: &[u8], done: PyObject) -> PyResult<()> {
        let values = values_of(data)?;
        self.ring.allreduce(
            values,
            Box::new(move |result| {
                Python::with_gil(|py| {
                    let outcome = match result {
                        Ok(v) => done.call1(py, (PyBytes::new(py, &bytes_of(&v)), py.None())),
                        Err(e) => done.call1(py, (py.None(), e)),
                    };
                    if let Err(e) = outcome {
                        // Nobody on this thread can take the exception: print it, as
                        // Python does for an exception in a thread.
                        e.print(py);
                    }
                })
            }),
        );
        Ok(())
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

/// A fresh job token: 64 hex digits from the operating system's random source.
#[pyfunction]
fn new_token() -> String {
    JobToken::generate().to_hex()
}

/// The native module: `Ring` and `new_token`.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Ring>()?;
    m.add_function(wrap_pyfunction!(new_token, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}

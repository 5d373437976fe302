use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::sync::mpsc::channel;
use std::time::Duration;

use super::*;
use crate::auth::JobToken;
use crate::comm::CommOptions;

/// A free port on loopback for the rendezvous (bound, then let go).
fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binds");
    listener.local_addr().expect("has an address").port()
}

fn context(rank: Rank, port: u16, token: &JobToken) -> ProcessContext {
    ProcessContext {
        rank,
        token: token.clone(),
        coordinator: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        host_coordinator: rank == 0,
        bind_ip: Ipv4Addr::LOCALHOST.into(),
        connect_timeout: Duration::from_secs(30),
        comm: CommOptions::default(),
        metrics: None,
    }
}

/// Joins `workers` rings on threads of this process and gives each to `body`, returning
/// what each rank's body returned, by rank.
fn with_rings<T: Send + 'static>(
    workers: usize,
    body: impl Fn(Ring) -> T + Send + Sync + Copy + 'static,
) -> Vec<T> {
    let port = free_port();
    let token = JobToken::generate();
    let handles: Vec<_> = (0..workers)
        .map(|rank| {
            let ctx = context(rank, port, &token);
            std::thread::spawn(move || body(Ring::join(&ctx, workers).expect("joins")))
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().expect("rank thread"))
        .collect()
}

/// Runs one all-reduce and waits for its result.
fn reduce(ring: &Ring, values: Vec<f32>) -> Result<Vec<f32>, String> {
    let (tx, rx) = channel();
    ring.allreduce(
        values,
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
    );
    rx.recv().expect("the completion is called")
}

/// A rank's buffer of `numel` values for operation `op`.
fn buffer(rank: Rank, op: usize, numel: usize) -> Vec<f32> {
    (0..numel)
        .map(|i| ((rank * 7 + op * 3 + i) % 11) as f32 * 0.1 - 0.3)
        .collect()
}

#[test]
fn buffers_of_changing_lengths_are_averaged_with_the_same_bits_everywhere() {
    const SIZES: [usize; 4] = [5, 300_000, 5, 1];
    let workers = 3;
    let results = with_rings(workers, move |ring| {
        let rank = ring.rank();
        (SIZES.iter().enumerate())
            .map(|(op, &n)| reduce(&ring, buffer(rank, op, n)).expect("reduces"))
            .collect::<Vec<_>>()
    });
    for (op, &n) in SIZES.iter().enumerate() {
        let inputs: Vec<Vec<f32>> = (0..workers).map(|r| buffer(r, op, n)).collect();
        let expected: Vec<f32> = (0..n)
            .map(|i| inputs.iter().map(|v| v[i]).sum::<f32>() / workers as f32)
            .collect();
        let first = &results[0][op];
        for (a, e) in first.iter().zip(&expected) {
            assert!((a - e).abs() < 1e-5, "operation {op}: {a} vs {e}");
        }
        for rank_results in &results[1..] {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&rank_results[op]), bits(first), "operation {op}");
        }
    }
}

#[test]
fn a_rank_that_leaves_fails_the_others_naming_it() {
    let results = with_rings(3, |ring| {
        if ring.rank() == 1 {
            drop(ring);
            return Ok(Vec::new());
        }
        let first = reduce(&ring, vec![1.0; 100]);
        let later = reduce(&ring, vec![1.0; 100]);
        assert_eq!(
            first, later,
            "every later operation fails with the job's error"
        );
        assert_eq!(ring.failure().as_ref(), first.as_ref().err());
        first
    });
    for rank in [0, 2] {
        let error = results[rank].as_ref().expect_err("the operation fails");
        assert!(error.contains("rank 1"), "rank {rank}: {error}");
    }
}

#[test]
fn operations_started_at_once_travel_together_and_complete_alike() {
    // 1000 values twice, two operations apart: an endpoint reused after skipping a step.
    const SIZES: [usize; 6] = [1000, 7, 250_000, 5, 1000, 250_000];
    let workers = 3;
    let results = with_rings(workers, move |ring| {
        let rank = ring.rank();
        let receivers: Vec<_> = (SIZES.iter().enumerate())
            .map(|(op, &n)| {
                let (tx, rx) = channel();
                ring.allreduce(
                    buffer(rank, op, n),
                    Box::new(move |r| {
                        let _ = tx.send(r);
                    }),
                );
                rx
            })
            .collect();
        (receivers.into_iter())
            .map(|rx| rx.recv().expect("completed").expect("reduces"))
            .collect::<Vec<_>>()
    });
    for (op, &n) in SIZES.iter().enumerate() {
        let inputs: Vec<Vec<f32>> = (0..workers).map(|r| buffer(r, op, n)).collect();
        let expected: Vec<f32> = (0..n)
            .map(|i| inputs.iter().map(|v| v[i]).sum::<f32>() / workers as f32)
            .collect();
        for (a, e) in results[0][op].iter().zip(&expected) {
            assert!((a - e).abs() < 1e-5, "operation {op}: {a} vs {e}");
        }
        for rank_results in &results[1..] {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&rank_results[op]),
                bits(&results[0][op]),
                "operation {op}"
            );
        }
    }
}

#[test]
fn a_panic_of_the_thread_fails_the_pending_and_the_queued_operations() {
    // Rank 1 keeps its ring open until rank 0 has its errors: were it to close first, rank
    // 0's operation could fail with "rank 1 left" before the panic was injected.
    static RANK_0_DONE: std::sync::Barrier = std::sync::Barrier::new(2);
    let results = with_rings(2, |ring| {
        if ring.rank() == 1 {
            RANK_0_DONE.wait();
            return Vec::new();
        }
        let (tx, rx) = channel();
        for _ in 0..2 {
            let tx = tx.clone();
            ring.allreduce(
                vec![1.0; 100],
                Box::new(move |r| {
                    let _ = tx.send(r);
                }),
            );
            ring.inject_panic("injected for the test".into());
        }
        let errors = vec![rx.recv().expect("fails"), rx.recv().expect("fails")];
        RANK_0_DONE.wait();
        errors
    });
    for result in &results[0] {
        let error = result.as_ref().expect_err("fails");
        assert!(error.contains("injected for the test"), "{error}");
    }
}

#[test]
fn half_float_operations_beside_f32_ones_of_the_same_length_agree_everywhere() {
    // The same length as f32, bf16 and f16, all in flight at once: each float its own
    // endpoint, frames arriving before their operation starts here kept at their size.
    const OPS: [(usize, WireFloat); 5] = [
        (100_000, WireFloat::Bf16),
        (100_000, WireFloat::F32),
        (7, WireFloat::F16),
        (100_000, WireFloat::F16),
        (100_000, WireFloat::Bf16),
    ];
    let workers = 3;
    let results = with_rings(workers, move |ring| {
        let rank = ring.rank();
        let receivers: Vec<_> = (OPS.iter().enumerate())
            .map(|(op, &(n, float))| {
                let (tx, rx) = channel();
                let done: Completion = Box::new(move |r| {
                    let _ = tx.send(r);
                });
                let values = buffer(rank, op, n);
                ring.start(Box::new(VecOperation {
                    values,
                    float,
                    done,
                }));
                rx
            })
            .collect();
        (receivers.into_iter())
            .map(|rx| rx.recv().expect("completed").expect("reduces"))
            .collect::<Vec<_>>()
    });
    for (op, &(n, float)) in OPS.iter().enumerate() {
        let inputs: Vec<Vec<f32>> = (0..workers).map(|r| buffer(r, op, n)).collect();
        let tolerance = match float {
            WireFloat::F32 => 1e-5,
            WireFloat::F16 => 2e-3,
            WireFloat::Bf16 => 2e-2,
        };
        for (i, a) in results[0][op].iter().enumerate() {
            let e = inputs.iter().map(|v| v[i]).sum::<f32>() / workers as f32;
            assert!((a - e).abs() < tolerance, "operation {op}: {a} vs {e}");
            assert_eq!(float.round(*a), *a, "operation {op}: not a {float:?}");
        }
        for rank_results in &results[1..] {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&rank_results[op]), bits(&results[0][op]), "op {op}");
        }
    }
}

//! Rendezvous and mesh across "processes" (threads) on 127.0.0.1.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use syncopate_core::wire::mac::{FrameOpener, FrameSealer, Tag, TAG_LEN};
use syncopate_core::wire::{FrameKind, Header, DEFAULT_MAX_PAYLOAD};
use syncopate_runtime::auth::{JobToken, PeerInfo, Role};
use syncopate_runtime::comm::Link;
use syncopate_runtime::frame_io::{read_frame, write_frame};
use syncopate_runtime::rendezvous::{
    connect_mesh, register, serve_coordinator, Member, RendezvousError,
};

const TIMEOUT: Duration = Duration::from_secs(10);
const SHORT: Duration = Duration::from_millis(1500);

fn worker(rank: usize, workers: usize, fingerprint: u64) -> PeerInfo {
    PeerInfo::new(rank, Role::Worker, fingerprint, "allreduce", workers, 0)
}

/// Starts a coordinator for `world_size` members on 127.0.0.1:0.
fn start_coordinator(
    token: &JobToken,
    world_size: usize,
    timeout: Duration,
) -> (
    SocketAddr,
    thread::JoinHandle<Result<Vec<Member>, RendezvousError>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let info = PeerInfo::new(0, Role::Coordinator, 0, "", world_size, 0);
    let token = token.clone();
    let handle =
        thread::spawn(move || serve_coordinator(listener, &token, &info, world_size, timeout));
    (addr, handle)
}

/// Registers `me` (with a fresh data listener) and returns the table.
fn start_member(
    coordinator: SocketAddr,
    token: &JobToken,
    me: PeerInfo,
    timeout: Duration,
) -> thread::JoinHandle<Result<Vec<Member>, RendezvousError>> {
    let token = token.clone();
    thread::spawn(move || {
        let data = TcpListener::bind("127.0.0.1:0").unwrap();
        register(
            coordinator,
            &token,
            &me,
            data.local_addr().unwrap(),
            &[],
            timeout,
        )
    })
}

#[test]
fn four_processes_rendezvous_and_build_a_full_mesh() {
    let token = JobToken::generate();
    let (coord_addr, coordinator) = start_coordinator(&token, 4, TIMEOUT);
    let members: Vec<_> = (0..4)
        .map(|rank| {
            let token = token.clone();
            thread::spawn(move || {
                let me = worker(rank, 4, 0xfeed);
                let data = TcpListener::bind("127.0.0.1:0").unwrap();
                let addr = data.local_addr().unwrap();
                let table = register(coord_addr, &token, &me, addr, &[], TIMEOUT).unwrap();
                let peers: Vec<usize> = (0..4).filter(|&r| r != rank).collect();
                let links = connect_mesh(&me, &table, &peers, &data, &token, TIMEOUT).unwrap();
                (table, exchange_one_frame(rank, links))
            })
        })
        .collect();
    let results: Vec<_> = members.into_iter().map(|h| h.join().unwrap()).collect();
    let table = coordinator.join().unwrap().unwrap();

    assert_eq!(
        table.iter().map(|m| m.rank).collect::<Vec<_>>(),
        [0, 1, 2, 3]
    );
    for (rank, (their_table, heard_from)) in results.into_iter().enumerate() {
        assert_eq!(their_table, table);
        let expected: Vec<usize> = (0..4).filter(|&r| r != rank).collect();
        assert_eq!(heard_from, expected, "rank {rank}");
    }
}

/// Sends one data frame, with its MAC tag, on every link, then reads one from every link;
/// returns the senders heard from, checking each link carries the frame of the rank it
/// claims, tagged with the key the two ends' handshake gave them.
fn exchange_one_frame(rank: usize, links: Vec<Link>) -> Vec<usize> {
    let mut links = links;
    for link in &mut links {
        let mut h = Header::data(FrameKind::Push, 1, 0, 0, 1);
        h.sender = rank as u32;
        let payload = (rank as f32).to_le_bytes();
        write_frame(&mut link.stream, &h, &payload).unwrap();
        let tag = FrameSealer::new(&link.keys.send).seal(&h.encode(), &[&payload]);
        link.stream.write_all(&tag).unwrap();
    }
    links
        .iter_mut()
        .map(|link| {
            let (h, payload) = read_frame(&mut link.stream, DEFAULT_MAX_PAYLOAD).unwrap();
            assert_eq!(h.sender as usize, link.peer);
            assert_eq!(payload, (link.peer as f32).to_le_bytes());
            let mut tag: Tag = [0; TAG_LEN];
            link.stream.read_exact(&mut tag).unwrap();
            let mut opener = FrameOpener::new(&link.keys.recv);
            opener.update(&payload);
            let opened = opener.finish(&h.encode(), &tag);
            assert_eq!(opened, Ok(0), "rank {rank} from {}", link.peer);
            link.peer
        })
        .collect()
}

#[test]
fn wrong_token_is_refused_and_both_sides_say_authentication_failed() {
    let token = JobToken::generate();
    let (coord_addr, coordinator) = start_coordinator(&token, 2, SHORT);
    let good = start_member(coord_addr, &token, worker(0, 2, 1), TIMEOUT);
    let intruder = start_member(coord_addr, &JobToken::generate(), worker(1, 2, 1), TIMEOUT);

    let e = intruder.join().unwrap().unwrap_err().to_string();
    assert!(e.contains("authentication failed"), "{e}");
    let e = coordinator.join().unwrap().unwrap_err().to_string();
    assert!(e.contains("authentication failed"), "{e}");
    assert!(e.contains("ranks [1]"), "{e}");
    // The rightful member is told the rendezvous failed, and why.
    let e = good.join().unwrap().unwrap_err().to_string();
    assert!(e.contains("never registered"), "{e}");
}

#[test]
fn different_model_fingerprint_is_refused_naming_it() {
    let token = JobToken::generate();
    let (coord_addr, coordinator) = start_coordinator(&token, 2, SHORT);
    let first = start_member(coord_addr, &token, worker(0, 2, 0xaaaa), TIMEOUT);
    // Let rank 0 register first so that rank 1 is the odd one out.
    thread::sleep(Duration::from_millis(300));
    let odd = start_member(coord_addr, &token, worker(1, 2, 0xbbbb), TIMEOUT);

    let e = odd.join().unwrap().unwrap_err().to_string();
    assert!(
        e.contains("model fingerprint 0x000000000000bbbb differs from rank 0 (worker)'s 0x000000000000aaaa"),
        "{e}"
    );
    let e = coordinator.join().unwrap().unwrap_err().to_string();
    assert!(e.contains("model fingerprint"), "{e}");
    assert!(first.join().unwrap().is_err());
}

#[test]
fn garbage_is_refused_without_panic_or_hang() {
    let token = JobToken::generate();
    let start = Instant::now();
    let (coord_addr, coordinator) = start_coordinator(&token, 1, SHORT);
    let mut s = TcpStream::connect(coord_addr).unwrap();
    // Exactly one header's worth, so that nothing is left unread when the coordinator hangs up.
    let garbage = format!("{:<48}", "GET / HTTP/1.1\r\nHost: syncopate\r\n\r\n");
    s.write_all(garbage.as_bytes()).unwrap();
    s.set_read_timeout(Some(TIMEOUT)).unwrap();
    let (h, reason) = read_frame(&mut s, DEFAULT_MAX_PAYLOAD).unwrap();
    assert_eq!(h.kind, FrameKind::Abort);
    assert!(String::from_utf8_lossy(&reason).contains("bad magic"));

    // A silent connection does not block the coordinator either.
    let _silent = TcpStream::connect(coord_addr).unwrap();

    let e = coordinator.join().unwrap().unwrap_err().to_string();
    assert!(e.contains("bad magic"), "{e}");
    assert!(start.elapsed() < SHORT + Duration::from_secs(5));
}

#[test]
fn coordinator_keeps_serving_after_garbage() {
    let token = JobToken::generate();
    let (coord_addr, coordinator) = start_coordinator(&token, 1, TIMEOUT);
    let mut junk = TcpStream::connect(coord_addr).unwrap();
    junk.write_all(&[0xff; 200]).unwrap();
    let mut sink = Vec::new();
    let _ = junk.read_to_end(&mut sink);
    let table = start_member(coord_addr, &token, worker(0, 1, 1), TIMEOUT)
        .join()
        .unwrap()
        .unwrap();
    assert_eq!(table, coordinator.join().unwrap().unwrap());
}

#[test]
fn duplicate_rank_is_refused() {
    let token = JobToken::generate();
    let (coord_addr, coordinator) = start_coordinator(&token, 2, SHORT);
    let first = start_member(coord_addr, &token, worker(0, 2, 1), TIMEOUT);
    thread::sleep(Duration::from_millis(300));
    let again = start_member(coord_addr, &token, worker(0, 2, 1), TIMEOUT);
    let e = again.join().unwrap().unwrap_err().to_string();
    assert!(e.contains("rank 0 is already registered"), "{e}");
    assert!(coordinator.join().unwrap().is_err());
    assert!(first.join().unwrap().is_err());
}

#[test]
fn asymmetric_links_time_out_naming_the_missing_rank() {
    let token = JobToken::generate();
    let (coord_addr, coordinator) = start_coordinator(&token, 2, TIMEOUT);
    let data: Vec<TcpListener> = (0..2)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let addrs: Vec<SocketAddr> = data.iter().map(|l| l.local_addr().unwrap()).collect();
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let token = token.clone();
            let addr = addrs[rank];
            thread::spawn(move || {
                register(coord_addr, &token, &worker(rank, 2, 1), addr, &[], TIMEOUT)
            })
        })
        .collect();
    let table = coordinator.join().unwrap().unwrap();
    for h in handles {
        h.join().unwrap().unwrap();
    }
    // Rank 0 expects rank 1, which never dials.
    let e = connect_mesh(&worker(0, 2, 1), &table, &[1], &data[0], &token, SHORT)
        .unwrap_err()
        .to_string();
    assert!(e.contains("ranks [1]"), "{e}");
}

/// A connection that never says a word is cut off after the admission deadline (5 s), not
/// held until the end of the rendezvous, and the coordinator says so.
#[test]
fn a_silent_connection_is_cut_off_at_the_admission_deadline() {
    let token = JobToken::generate();
    let (addr, coordinator) = start_coordinator(&token, 1, Duration::from_secs(8));
    let mut silent = TcpStream::connect(addr).unwrap();
    let start = Instant::now();
    // The coordinator closes the connection: the read ends (EOF or a reset), well before
    // the 8 s of the whole rendezvous.
    let mut buf = [0u8; 64];
    silent
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    loop {
        match silent.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    let cut_after = start.elapsed();
    assert!(
        cut_after < Duration::from_millis(7500),
        "cut after {cut_after:?}"
    );
    match coordinator.join().unwrap() {
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains("cut off"), "{msg}");
        }
        Ok(_) => panic!("nobody registered"),
    }
}

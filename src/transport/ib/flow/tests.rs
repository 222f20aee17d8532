//! The flow-control and completion state machines against the in-memory queue pair.

use super::*;
use crate::error::ncclResult_t;
use crate::transport::ib::sim::{Sim, SimEnd, FIFO_BASE, FIFO_RKEY};

const PEER: &str = "rank 1 (10.0.0.2:4000)";
const LKEY: u32 = 0x11;

/// A sender and receiver over one simulated queue pair, with buffers per message.
struct Pair {
    sim: Sim,
    send_end: SimEnd,
    recv_end: SimEnd,
    send: SendFlow,
    recv: RecvFlow,
    /// rkeys handed out for receive buffers.
    next_rkey: u32,
}

impl Pair {
    fn new(sq_depth: usize, max_write: usize) -> Pair {
        let sim = Sim::new(sq_depth, FIFO_SLOTS, FIFO_SLOTS);
        Pair {
            send_end: sim.end(0),
            recv_end: sim.end(1),
            send: SendFlow::new(PEER, sq_depth).with_max_write(max_write),
            recv: RecvFlow::new(PEER, RemoteSeg { addr: FIFO_BASE, rkey: FIFO_RKEY }, sq_depth)
                .with_max_write(max_write),
            sim,
            next_rkey: 0x100,
        }
    }

    fn isend(&mut self, data: &[u8]) -> Option<RequestId> {
        self.send.post(data.as_ptr() as u64, data.len(), LKEY).unwrap()
    }

    fn irecv(&mut self, buf: &mut [u8]) -> Option<RequestId> {
        let rkey = self.next_rkey;
        self.next_rkey += 1;
        self.sim.expose(1, rkey, buf.as_mut_ptr() as u64, buf.len());
        self.recv.post(buf.as_mut_ptr() as u64, buf.len(), rkey).unwrap()
    }

    /// One round of progress on both sides.
    fn step(&mut self) {
        self.recv.progress(&mut self.recv_end).unwrap();
        self.send.progress(&mut self.send_end).unwrap();
    }

    fn run_until(&mut self, mut done: impl FnMut(&mut Pair) -> bool) {
        for _ in 0..1000 {
            self.step();
            if done(self) {
                return;
            }
        }
        panic!("no progress after 1000 rounds");
    }
}

fn pattern(n: usize, seed: u8) -> Vec<u8> {
    (0..n).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

#[test]
fn one_message_moves_and_completes_both_sides() {
    for len in [0usize, 1, 7, 4096, 100_000] {
        let mut p = Pair::new(64, MAX_WRITE);
        let data = pattern(len, 3);
        let mut buf = vec![0u8; len];
        let s = p.isend(&data).unwrap();
        let r = p.irecv(&mut buf).unwrap();
        let (mut sent, mut got) = (None, None);
        p.run_until(|p| {
            sent = sent.or(p.send.test(s).unwrap());
            got = got.or(p.recv.test(r).unwrap());
            sent.is_some() && got.is_some()
        });
        assert_eq!((sent, got), (Some(len), Some(len)));
        assert_eq!(buf, data, "len {len}");
        assert_eq!(p.send.outstanding(), 0, "reported requests are forgotten");
        assert_eq!(p.recv.outstanding(), 0);
        assert!(p.send.progress_mark() > 0 && p.recv.progress_mark() > 0);
    }
}

#[test]
fn a_send_waits_for_its_clear_to_send() {
    let mut p = Pair::new(64, MAX_WRITE);
    let data = pattern(64, 1);
    let s = p.isend(&data).unwrap();
    for _ in 0..10 {
        p.step();
        assert_eq!(p.send.test(s).unwrap(), None);
    }
    assert_eq!(p.sim.writes_posted(0), 0, "nothing is written before the receiver posts");
    let mut buf = vec![0u8; 64];
    let r = p.irecv(&mut buf).unwrap();
    p.run_until(|p| p.recv.test(r).unwrap().is_some());
    assert_eq!(p.send.test(s).unwrap(), Some(64));
    assert_eq!(buf, data);
}

#[test]
fn many_messages_wrap_the_fifo_and_arrive_in_order() {
    // 5 x the FIFO, with both sides refused (None) whenever they are FIFO_SLOTS ahead.
    let n = 5 * FIFO_SLOTS + 3;
    let mut p = Pair::new(2 * FIFO_SLOTS, MAX_WRITE);
    let sends: Vec<Vec<u8>> = (0..n).map(|i| pattern(100 + i, i as u8)).collect();
    let mut bufs: Vec<Vec<u8>> = (0..n).map(|i| vec![0u8; 100 + i]).collect();
    let (mut s_reqs, mut r_reqs) = (VecDeque::new(), VecDeque::new());
    let (mut next_s, mut next_r, mut done_s, mut done_r) = (0, 0, 0, 0);
    let mut refused = (0, 0);
    for _ in 0..10_000 {
        while next_s < n {
            match p.send.post(sends[next_s].as_ptr() as u64, sends[next_s].len(), LKEY).unwrap() {
                Some(id) => {
                    s_reqs.push_back(id);
                    next_s += 1;
                }
                None => {
                    refused.0 += 1;
                    assert_eq!(p.send.outstanding(), FIFO_SLOTS);
                    break;
                }
            }
        }
        while next_r < n {
            let buf = &mut bufs[next_r];
            let rkey = 0x1000 + next_r as u32;
            p.sim.expose(1, rkey, buf.as_mut_ptr() as u64, buf.len());
            match p.recv.post(buf.as_mut_ptr() as u64, buf.len(), rkey).unwrap() {
                Some(id) => {
                    r_reqs.push_back(id);
                    next_r += 1;
                }
                None => {
                    refused.1 += 1;
                    assert_eq!(p.recv.outstanding(), FIFO_SLOTS);
                    break;
                }
            }
        }
        p.step();
        while let Some(&id) = s_reqs.front() {
            match p.send.test(id).unwrap() {
                Some(len) => {
                    assert_eq!(len, 100 + done_s);
                    s_reqs.pop_front();
                    done_s += 1;
                }
                None => break,
            }
        }
        while let Some(&id) = r_reqs.front() {
            match p.recv.test(id).unwrap() {
                Some(len) => {
                    assert_eq!(len, 100 + done_r);
                    r_reqs.pop_front();
                    done_r += 1;
                }
                None => break,
            }
        }
        if done_s == n && done_r == n {
            break;
        }
    }
    assert_eq!((done_s, done_r), (n, n));
    assert!(refused.0 > 0 && refused.1 > 0, "both sides hit the FIFO limit: {refused:?}");
    for i in 0..n {
        assert_eq!(bufs[i], sends[i], "message {i}");
    }
}

#[test]
fn fifo_full_refuses_then_accepts_after_a_completion() {
    let mut p = Pair::new(2 * FIFO_SLOTS, MAX_WRITE);
    let mut bufs = vec![vec![0u8; 8]; FIFO_SLOTS + 1];
    let mut ids = Vec::new();
    for b in bufs.iter_mut().take(FIFO_SLOTS) {
        ids.push(p.irecv(b).unwrap());
    }
    let (last, rest) = bufs.split_last_mut().unwrap();
    let _ = rest;
    assert_eq!(p.irecv(last), None, "receive {} is refused", FIFO_SLOTS + 1);
    let data = vec![vec![9u8; 8]; FIFO_SLOTS + 1];
    let mut sids = Vec::new();
    for d in data.iter().take(FIFO_SLOTS) {
        sids.push(p.isend(d).unwrap());
    }
    assert_eq!(p.send.post(data[FIFO_SLOTS].as_ptr() as u64, 8, LKEY).unwrap(), None, "send refused too");
    p.run_until(|p| p.recv.test(ids[0]).unwrap().is_some());
    p.run_until(|p| p.send.test(sids[0]).unwrap().is_some());
    assert!(p.irecv(last).is_some(), "a slot is free again");
    assert!(p.send.post(data[FIFO_SLOTS].as_ptr() as u64, 8, LKEY).unwrap().is_some());
}

#[test]
fn completions_in_any_order_and_tests_in_any_order() {
    let k = 6;
    let mut p = Pair::new(64, MAX_WRITE);
    p.sim.hold_completions(0, true);
    p.sim.hold_completions(1, true);
    let sends: Vec<Vec<u8>> = (0..k).map(|i| pattern(33, i as u8)).collect();
    let mut bufs = vec![vec![0u8; 33]; k];
    let sids: Vec<RequestId> = sends.iter().map(|d| p.isend(d).unwrap()).collect();
    let rids: Vec<RequestId> = bufs.iter_mut().map(|b| p.irecv(b).unwrap()).collect();
    for _ in 0..5 {
        p.step();
    }
    // All writes landed but no completion was reported: nothing is done yet.
    assert_eq!(p.sim.held_completions(0), k);
    assert_eq!(p.sim.held_completions(1), 2 * k, "k CTS writes and k receives");
    for (&s, &r) in sids.iter().zip(&rids) {
        assert_eq!(p.send.test(s).unwrap(), None);
        assert_eq!(p.recv.test(r).unwrap(), None);
    }
    // Reverse order on the sender; on the receiver, every receive before any CTS completion
    // (the data completing before the CTS write that allowed it).
    p.sim.release_completions(0, |n| (0..n).rev().collect());
    p.sim.release_completions(1, |n| (0..n).rev().collect());
    p.step();
    for i in (0..k).rev() {
        assert_eq!(p.send.test(sids[i]).unwrap(), Some(33), "send {i}");
        assert_eq!(p.recv.test(rids[i]).unwrap(), Some(33), "receive {i}");
    }
    assert_eq!(p.send.outstanding(), 0);
    assert_eq!(p.recv.outstanding(), 0);
    assert_eq!(bufs, sends);
}

#[test]
fn a_receive_needs_its_cts_completion_as_well_as_the_data() {
    let mut p = Pair::new(64, MAX_WRITE);
    p.sim.hold_completions(1, true);
    let data = pattern(10, 0);
    let mut buf = vec![0u8; 10];
    let s = p.isend(&data).unwrap();
    let r = p.irecv(&mut buf).unwrap();
    p.run_until(|p| p.send.test(s).unwrap().is_some());
    // Release only the data's receive completion (index 1; index 0 is the CTS write's).
    p.sim.release_completions(1, |_| vec![1]);
    for _ in 0..3 {
        p.step();
        assert_eq!(p.recv.test(r).unwrap(), None, "the CTS write has not completed");
    }
    p.sim.release_completions(1, |n| (0..n).collect());
    p.step();
    assert_eq!(p.recv.test(r).unwrap(), Some(10));
    assert_eq!(buf, data);
}

#[test]
fn messages_larger_than_one_write_go_in_pieces_within_the_send_queue() {
    // Writes of at most 10 bytes and a send queue of 3: 95 bytes need 10 writes, posted as
    // completions make room; the receiver sees one immediate with the last piece's length.
    let mut p = Pair::new(3, 10);
    let data = pattern(95, 7);
    let mut buf = vec![0u8; 95];
    p.sim.hold_completions(0, true);
    let s = p.isend(&data).unwrap();
    let r = p.irecv(&mut buf).unwrap();
    p.step();
    p.step();
    assert_eq!(p.sim.writes_posted(0), 3, "the send queue holds 3");
    p.sim.hold_completions(0, false);
    p.sim.release_completions(0, |n| (0..n).collect());
    let mut got = None;
    p.run_until(|p| {
        got = got.or(p.recv.test(r).unwrap());
        got.is_some() && p.send.test(s).unwrap().is_some()
    });
    assert_eq!(p.sim.writes_posted(0), 10);
    assert_eq!(buf, data);
    assert_eq!(last_piece(95, 10), 5);
    assert_eq!(last_piece(100, 10), 10);
    assert_eq!(last_piece(0, 10), 0);
    assert_eq!(last_piece(1, 10), 1);
}

#[test]
fn a_later_message_never_overtakes_an_earlier_ones_pieces() {
    let mut p = Pair::new(2, 4);
    let a = pattern(12, 1); // 3 writes
    let b = pattern(3, 2); // 1 write
    let (mut ba, mut bb) = (vec![0u8; 12], vec![0u8; 3]);
    p.sim.hold_writes(true);
    let sa = p.isend(&a).unwrap();
    let sb = p.isend(&b).unwrap();
    let ra = p.irecv(&mut ba).unwrap();
    let rb = p.irecv(&mut bb).unwrap();
    p.step();
    p.sim.land_all(); // the CTS entries
    p.step();
    assert_eq!(p.sim.in_flight(), 2, "two pieces of a, none of b");
    p.sim.hold_writes(false);
    p.sim.land_all();
    let mut done = [false; 4];
    p.run_until(|p| {
        done[0] |= p.send.test(sa).unwrap().is_some();
        done[1] |= p.send.test(sb).unwrap().is_some();
        done[2] |= p.recv.test(ra).unwrap().is_some();
        done[3] |= p.recv.test(rb).unwrap().is_some();
        done.iter().all(|&d| d)
    });
    assert_eq!((ba, bb), (a, b));
}

#[test]
fn a_failed_data_write_fails_the_sender_with_a_remote_error_naming_the_peer() {
    let mut p = Pair::new(64, MAX_WRITE);
    let data = pattern(16, 0);
    let mut buf = vec![0u8; 16];
    let s = p.isend(&data).unwrap();
    let r = p.irecv(&mut buf).unwrap();
    p.recv.progress(&mut p.recv_end).unwrap(); // CTS out
    p.sim.fail_next_write(0, 12);
    p.send.progress(&mut p.send_end).unwrap();
    p.send.progress(&mut p.send_end).unwrap();
    let e = p.send.test(s).unwrap_err();
    assert_eq!(e.code(), ncclResult_t::ncclRemoteError, "{e}");
    let msg = e.to_string();
    assert!(
        msg.contains(PEER) && msg.contains("transport retry counter exceeded") && msg.contains("status 12"),
        "{msg}"
    );
    // The connection stays failed: new sends are refused with the same error.
    let again = p.send.post(data.as_ptr() as u64, 16, LKEY).unwrap_err();
    assert_eq!(again.code(), ncclResult_t::ncclRemoteError);
    // The receiver heard nothing: still waiting, no error of its own.
    p.recv.progress(&mut p.recv_end).unwrap();
    assert_eq!(p.recv.test(r).unwrap(), None);
}

#[test]
fn local_completion_errors_are_system_errors() {
    for (status, code, name) in [
        (4, ncclResult_t::ncclSystemError, "local protection error"),
        (1, ncclResult_t::ncclSystemError, "local length error"),
        (19, ncclResult_t::ncclSystemError, "fatal error"),
        (10, ncclResult_t::ncclRemoteError, "remote access error"),
        (13, ncclResult_t::ncclRemoteError, "RNR retry counter exceeded"),
        (5, ncclResult_t::ncclRemoteError, "work request flushed"),
    ] {
        let c = Completion { wr_id: 1, status, vendor_err: 0x12, recv: None };
        let e = completion_error(&c, "RDMA write", PEER);
        assert_eq!(e.code(), code, "status {status}");
        assert!(e.to_string().contains(name) && e.to_string().contains(PEER) && e.to_string().contains("0x12"), "{e}");
    }
    assert_eq!(wc_status_name(99), "unknown status");
}

#[test]
fn a_failed_cts_write_fails_the_receiver() {
    let mut p = Pair::new(64, MAX_WRITE);
    let mut buf = vec![0u8; 16];
    p.sim.fail_next_write(1, 10);
    let r = p.irecv(&mut buf).unwrap();
    p.recv.progress(&mut p.recv_end).unwrap();
    p.recv.progress(&mut p.recv_end).unwrap();
    let e = p.recv.test(r).unwrap_err();
    assert_eq!(e.code(), ncclResult_t::ncclRemoteError);
    assert!(e.to_string().contains("clear-to-send write of message 1") && e.to_string().contains(PEER), "{e}");
    // The connection is failed: new receives are refused with the same error.
    let again = p.recv.post(buf.as_mut_ptr() as u64, 16, 1).unwrap_err();
    assert_eq!(again.code(), ncclResult_t::ncclRemoteError);
}

#[test]
fn a_receive_buffer_the_peer_cannot_write_is_a_remote_access_error() {
    let mut p = Pair::new(64, MAX_WRITE);
    let data = pattern(16, 0);
    let mut buf = vec![0u8; 16];
    let s = p.isend(&data).unwrap();
    // Advertise the buffer without exposing it: the sender's write gets REM_ACCESS_ERR.
    let r = p.recv.post(buf.as_mut_ptr() as u64, 16, 0xbad).unwrap().unwrap();
    p.step();
    p.step();
    let e = p.send.test(s).unwrap_err();
    assert_eq!(e.code(), ncclResult_t::ncclRemoteError);
    assert!(e.to_string().contains("remote access error"), "{e}");
    assert_eq!(p.recv.test(r).unwrap(), None);
}

#[test]
fn size_mismatch_fails_both_sides_without_writing() {
    let mut p = Pair::new(64, MAX_WRITE);
    let data = pattern(100, 0);
    let mut buf = vec![0xeeu8; 64];
    let s = p.isend(&data).unwrap();
    let r = p.irecv(&mut buf).unwrap();
    p.step();
    p.step();
    let es = p.send.test(s).unwrap_err();
    assert_eq!(es.code(), ncclResult_t::ncclInvalidUsage);
    assert!(es.to_string().contains("sent 100 bytes, 64 were posted") && es.to_string().contains(PEER), "{es}");
    p.recv.progress(&mut p.recv_end).unwrap();
    let er = p.recv.test(r).unwrap_err();
    assert_eq!(er.code(), ncclResult_t::ncclInvalidUsage);
    assert!(er.to_string().contains("message size mismatch") && er.to_string().contains("64 were posted"), "{er}");
    assert!(buf.iter().all(|&b| b == 0xee), "nothing was written");
}

#[test]
fn a_peer_that_closes_fails_outstanding_requests_only() {
    // Receiver waiting for data when the sender goes away.
    let mut p = Pair::new(64, MAX_WRITE);
    let mut buf = vec![0u8; 8];
    let r = p.irecv(&mut buf).unwrap();
    p.recv.progress(&mut p.recv_end).unwrap();
    p.sim.close(0);
    p.recv.progress(&mut p.recv_end).unwrap();
    let e = p.recv.test(r).unwrap_err();
    assert_eq!(e.code(), ncclResult_t::ncclRemoteError);
    assert!(
        e.to_string().contains("closed by the peer with 1 request(s) outstanding") && e.to_string().contains(PEER),
        "{e}"
    );

    // Sender waiting for a CTS when the receiver goes away.
    let mut p = Pair::new(64, MAX_WRITE);
    let data = pattern(8, 0);
    let s = p.isend(&data).unwrap();
    p.sim.close(1);
    p.send.progress(&mut p.send_end).unwrap();
    assert_eq!(p.send.test(s).unwrap_err().code(), ncclResult_t::ncclRemoteError);

    // Nothing outstanding: no error now, but nothing new can be posted.
    let mut p = Pair::new(64, MAX_WRITE);
    p.sim.close(1);
    p.send.progress(&mut p.send_end).unwrap();
    let e = p.send.post(data.as_ptr() as u64, 8, LKEY).unwrap_err();
    assert_eq!(e.code(), ncclResult_t::ncclRemoteError);

    // Writes to a closed peer fail with retries exhausted (the fabric's view).
    let mut p = Pair::new(64, MAX_WRITE);
    let mut buf = vec![0u8; 8];
    let s = p.isend(&data).unwrap();
    p.irecv(&mut buf).unwrap();
    p.recv.progress(&mut p.recv_end).unwrap();
    p.sim.close(1);
    p.send.progress(&mut p.send_end).unwrap();
    p.send.progress(&mut p.send_end).unwrap();
    let e = p.send.test(s).unwrap_err();
    assert_eq!(e.code(), ncclResult_t::ncclRemoteError);
}

#[test]
fn data_that_arrived_before_the_peer_closed_still_completes() {
    // The sender writes, completes and goes away; the receiver has not polled yet. Its next
    // progress sees both the closure and the data: the receive succeeds.
    let mut p = Pair::new(64, MAX_WRITE);
    let data = pattern(8, 4);
    let mut buf = vec![0u8; 8];
    let s = p.isend(&data).unwrap();
    let r = p.irecv(&mut buf).unwrap();
    p.recv.progress(&mut p.recv_end).unwrap(); // CTS out
    p.send.progress(&mut p.send_end).unwrap(); // data out
    p.send.progress(&mut p.send_end).unwrap();
    assert_eq!(p.send.test(s).unwrap(), Some(8));
    p.sim.close(0);
    p.recv.progress(&mut p.recv_end).unwrap();
    assert_eq!(p.recv.test(r).unwrap(), Some(8));
    assert_eq!(buf, data);
    // Afterwards nothing new can be posted.
    assert_eq!(p.recv.post(buf.as_mut_ptr() as u64, 8, 1).unwrap_err().code(), ncclResult_t::ncclRemoteError);
}

#[test]
fn garbage_in_the_fifo_is_a_protocol_error() {
    let mut p = Pair::new(64, MAX_WRITE);
    let data = pattern(8, 0);
    let s = p.isend(&data).unwrap();
    // An entry for message 5 where message 1 is expected.
    p.sim.scribble_fifo(0, CtsEntry { addr: 0, size: 8, rkey: 1, seq: 5 }.encode());
    p.send.progress(&mut p.send_end).unwrap();
    let e = p.send.test(s).unwrap_err();
    assert_eq!(e.code(), ncclResult_t::ncclRemoteError);
    assert!(e.to_string().contains("protocol error"), "{e}");
    // Nonzero padding: the entry does not decode.
    let mut p = Pair::new(64, MAX_WRITE);
    let s = p.isend(&data).unwrap();
    let mut bad = CtsEntry { addr: 0, size: 8, rkey: 1, seq: 1 }.encode();
    bad[22] = 1;
    p.sim.scribble_fifo(0, bad);
    p.send.progress(&mut p.send_end).unwrap();
    assert_eq!(p.send.test(s).unwrap_err().code(), ncclResult_t::ncclRemoteError);
    // The previous occupant of a slot (message s - FIFO_SLOTS) just means "not yet".
    let mut p = Pair::new(64, MAX_WRITE);
    p.send.next_seq = FIFO_SLOTS as u64 + 1;
    p.send.first_seq = FIFO_SLOTS as u64 + 1;
    let s = p.isend(&data).unwrap();
    p.sim.scribble_fifo(0, CtsEntry { addr: 0, size: 8, rkey: 1, seq: 1 }.encode());
    p.send.progress(&mut p.send_end).unwrap();
    assert_eq!(p.send.test(s).unwrap(), None);
}

#[test]
fn an_immediate_for_the_wrong_message_is_a_protocol_error() {
    let mut p = Pair::new(64, MAX_WRITE);
    let mut buf = vec![0u8; 4];
    let r = p.irecv(&mut buf).unwrap();
    p.recv.progress(&mut p.recv_end).unwrap();
    // A write with immediate 7 lands in receive 1.
    let mut rogue = p.sim.end(0);
    p.sim.expose(1, 0x77, buf.as_mut_ptr() as u64, 4);
    rogue
        .post_write(
            99,
            WriteSource::Inline(&[1, 2, 3, 4]),
            RemoteSeg { addr: buf.as_ptr() as u64, rkey: 0x77 },
            Some(7),
        )
        .unwrap();
    p.recv.progress(&mut p.recv_end).unwrap();
    let e = p.recv.test(r).unwrap_err();
    assert_eq!(e.code(), ncclResult_t::ncclRemoteError);
    assert!(e.to_string().contains("message 7") && e.to_string().contains("protocol error"), "{e}");
}

#[test]
fn unknown_requests_and_completions_are_internal_errors() {
    let mut p = Pair::new(64, MAX_WRITE);
    assert_eq!(p.send.test(RequestId(42)).unwrap_err().code(), ncclResult_t::ncclInternalError);
    assert_eq!(p.recv.test(RequestId(42)).unwrap_err().code(), ncclResult_t::ncclInternalError);
    struct Stray;
    impl Rdma for Stray {
        fn post_write(&mut self, _: u64, _: WriteSource<'_>, _: RemoteSeg, _: Option<u32>) -> Result<()> {
            Ok(())
        }
        fn post_recv(&mut self, _: u64) -> Result<()> {
            Ok(())
        }
        fn poll(&mut self, out: &mut Vec<Completion>) -> Result<()> {
            out.push(Completion::ok(wr_id(WR_CTS, 1)));
            Ok(())
        }
        fn fifo_slot(&self, _: usize) -> [u8; CTS_BYTES] {
            [0; CTS_BYTES]
        }
        fn peer_closed(&mut self) -> bool {
            false
        }
    }
    p.send.progress(&mut Stray).unwrap();
    assert_eq!(p.send.post(0, 0, 0).unwrap_err().code(), ncclResult_t::ncclInternalError);
}

#[test]
fn wr_ids_and_message_numbers_survive_wrapping() {
    assert_eq!(wr_kind(wr_id(WR_RECV, 5)), WR_RECV);
    assert_eq!(widen(5, SEQ_BITS, 5), 5);
    assert_eq!(widen(3, SEQ_BITS, 10), 3);
    let big = (1u64 << SEQ_BITS) + 7;
    assert_eq!(widen(wr_id(WR_DATA, big) & SEQ_MASK, SEQ_BITS, big + 2), big);
}

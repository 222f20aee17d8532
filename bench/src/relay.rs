//! The canary under MPI: a phase process cannot be an MPI process of its own (it is started by
//! an MPI process, not by mpirun), so it asks its parent, which is one, to make each
//! process-level call ([`crate::procs::Procs`]) for it. They talk over a Unix socket in the
//! parent's private directory, one line per request and one per reply:
//!
//! | request | reply |
//! |---|---|
//! | `hello` | `<process index> <process count>` |
//! | `barrier` | `ok` |
//! | `allreduce <sum/min/max> <f64 bits, hex>` | `<f64 bits, hex>` |
//! | `gather <hex bytes>` | `all <hex>,<hex>,...` on process 0, `none` elsewhere |
//! | `broadcast <hex bytes>` | `<hex bytes>` (process 0's) |
//! | `allgather <u64>` | `<u64>,<u64>,...` |
//!
//! Every phase process makes the same calls in the same order, so the parents' MPI calls
//! match across processes exactly as the phases' would have.

use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::Mutex;

use crate::procs::{Procs, ReduceOp};

/// A phase's end of the relay.
pub struct Client {
    link: Mutex<BufReader<UnixStream>>,
    index: usize,
    nprocs: usize,
}

impl Client {
    pub fn connect(path: &Path) -> Result<Client, String> {
        let stream = UnixStream::connect(path)
            .map_err(|e| format!("cannot reach the canary relay at {}: {e}", path.display()))?;
        let mut client = Client { link: Mutex::new(BufReader::new(stream)), index: 0, nprocs: 1 };
        let hello = client.request("hello");
        (client.index, client.nprocs) = parse_hello(&hello).ok_or(format!("bad relay greeting '{hello}'"))?;
        Ok(client)
    }

    pub fn index(&self) -> usize {
        self.index
    }

    pub fn nprocs(&self) -> usize {
        self.nprocs
    }

    /// One request, one reply. A broken relay means the parent is gone: nothing can go on.
    fn request(&self, line: &str) -> String {
        let mut link = self.link.lock().unwrap_or_else(|p| p.into_inner());
        let mut reply = String::new();
        let sent = link.get_mut().write_all(format!("{line}\n").as_bytes());
        match sent.and_then(|()| link.read_line(&mut reply)) {
            Ok(n) if n > 0 => reply.trim_end_matches('\n').to_string(),
            _ => {
                eprintln!("ferroccl-bench: the canary relay to the parent process broke");
                std::process::exit(2)
            }
        }
    }

    pub fn barrier(&self) {
        self.request("barrier");
    }

    pub fn allreduce(&self, value: f64, op: ReduceOp) -> f64 {
        let reply = self.request(&format!("allreduce {} {:x}", op.name(), value.to_bits()));
        u64::from_str_radix(&reply, 16).map(f64::from_bits).unwrap_or_else(|_| bad_reply(&reply))
    }

    pub fn gather(&self, bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
        let reply = self.request(&format!("gather {}", hex(bytes)));
        if reply == "none" {
            return None;
        }
        let all = reply.strip_prefix("all ").unwrap_or_else(|| bad_reply(&reply));
        Some(all.split(',').map(|h| unhex(h).unwrap_or_else(|| bad_reply(&reply))).collect())
    }

    pub fn broadcast(&self, bytes: &mut [u8]) {
        let reply = self.request(&format!("broadcast {}", hex(bytes)));
        match unhex(&reply) {
            Some(b) if b.len() == bytes.len() => bytes.copy_from_slice(&b),
            _ => bad_reply(&reply),
        }
    }

    pub fn allgather_u64(&self, value: u64) -> Vec<u64> {
        let reply = self.request(&format!("allgather {value}"));
        reply.split(',').map(|v| v.parse().unwrap_or_else(|_| bad_reply(&reply))).collect()
    }
}

fn bad_reply(reply: &str) -> ! {
    eprintln!("ferroccl-bench: unexpected reply from the canary relay: '{reply}'");
    std::process::exit(2)
}

fn parse_hello(reply: &str) -> Option<(usize, usize)> {
    let (index, nprocs) = reply.split_once(' ')?;
    let (index, nprocs) = (index.parse().ok()?, nprocs.parse().ok()?);
    (index < nprocs).then_some((index, nprocs))
}

/// The parent's end: answers the phase's requests with `procs` until the phase closes the
/// connection (at its exit).
pub fn serve(stream: UnixStream, procs: &Procs) -> io::Result<()> {
    let mut writer = stream.try_clone()?;
    for line in BufReader::new(stream).lines() {
        let line = line?;
        let reply = answer(&line, procs).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, format!("bad request from the phase process: '{line}'"))
        })?;
        writer.write_all(format!("{reply}\n").as_bytes())?;
    }
    Ok(())
}

fn answer(line: &str, procs: &Procs) -> Option<String> {
    let (verb, arg) = line.split_once(' ').unwrap_or((line, ""));
    Some(match verb {
        "hello" => format!("{} {}", procs.index(), procs.nprocs()),
        "barrier" => {
            procs.barrier();
            "ok".into()
        }
        "allreduce" => {
            let (op, bits) = arg.split_once(' ')?;
            let value = f64::from_bits(u64::from_str_radix(bits, 16).ok()?);
            format!("{:x}", procs.allreduce(value, ReduceOp::parse(op)?).to_bits())
        }
        "gather" => match procs.gather(&unhex(arg)?) {
            Some(all) => format!("all {}", all.iter().map(|b| hex(b)).collect::<Vec<_>>().join(",")),
            None => "none".into(),
        },
        "broadcast" => {
            let mut bytes = unhex(arg)?;
            procs.broadcast(&mut bytes);
            hex(&bytes)
        }
        "allgather" => {
            let all = procs.allgather_u64(arg.parse().ok()?);
            all.iter().map(u64::to_string).collect::<Vec<_>>().join(",")
        }
        _ => return None,
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if text.len() % 2 != 0 {
        return None;
    }
    (0..text.len()).step_by(2).map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips() {
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
        assert_eq!(unhex("00ab10"), Some(vec![0, 0xab, 0x10]));
        assert_eq!(unhex(""), Some(vec![]));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }

    #[test]
    fn a_single_process_answers_like_mpi_with_one_rank() {
        let procs = Procs::Single;
        assert_eq!(answer("hello", &procs).as_deref(), Some("0 1"));
        assert_eq!(answer("barrier", &procs).as_deref(), Some("ok"));
        let bits = format!("{:x}", 2.5f64.to_bits());
        assert_eq!(answer(&format!("allreduce max {bits}"), &procs), Some(bits.clone()));
        assert_eq!(answer("gather 6869", &procs).as_deref(), Some("all 6869"));
        assert_eq!(answer("gather ", &procs).as_deref(), Some("all "));
        assert_eq!(answer("broadcast 0102", &procs).as_deref(), Some("0102"));
        assert_eq!(answer("allgather 42", &procs).as_deref(), Some("42"));
        assert_eq!(answer("allreduce avg 0", &procs), None);
        assert_eq!(answer("launch", &procs), None);
    }

    #[test]
    fn a_phase_talks_to_its_parent_over_the_socket() {
        let (phase_end, parent_end) = UnixStream::pair().unwrap();
        let parent = std::thread::spawn(move || serve(parent_end, &Procs::Single));
        let client = Client { link: Mutex::new(BufReader::new(phase_end)), index: 0, nprocs: 1 };
        assert_eq!(parse_hello(&client.request("hello")), Some((0, 1)));
        client.barrier();
        assert_eq!(client.allreduce(-1.25, ReduceOp::Sum), -1.25);
        assert_eq!(client.gather(b"rank 0"), Some(vec![b"rank 0".to_vec()]));
        let mut id = [7u8; 16];
        client.broadcast(&mut id);
        assert_eq!(id, [7u8; 16]);
        assert_eq!(client.allgather_u64(9), vec![9]);
        drop(client);
        parent.join().unwrap().unwrap();
    }

    #[test]
    fn greetings_are_checked() {
        assert_eq!(parse_hello("1 2"), Some((1, 2)));
        assert_eq!(parse_hello("2 2"), None);
        assert_eq!(parse_hello("x"), None);
    }
}

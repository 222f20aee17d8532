//! `--canary`: the check operators run before enabling encryption fleet-wide (issue 4). The same
//! benchmark on the same ranks, plaintext then encrypted, compared by bus bandwidth and p99
//! latency; the run fails when encryption costs more than `--max-loss` percent of busbw.
//!
//! The library's encryption setting is process-global and frozen by the first unique id or
//! communicator, so each phase runs in a child process: this binary again, with the same
//! arguments plus the hidden `--canary-phase` and `--canary-out`. The child benchmarks as
//! usual (its table goes straight to our stdout), records every timed iteration, asks the
//! library for each communicator's encryption report, and writes its JSON document to
//! `--canary-out`. The encrypted child gets its key in [`PSK_VAR`], never on the command line.
//!
//! Under mpirun every process does the same with its own phase process; those are not MPI
//! processes, so each asks its parent to make its MPI calls (relay.rs), and process 0's phase
//! gathers the results and reports of all ranks.
//!
//! The reports are checked before any number is trusted: a canary that measured plaintext
//! twice would approve encryption for free.

use std::ffi::c_char;
use std::io::Write;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::Duration;

use ferroccl::ffi::coverage::ferrocclCommEncryptionReport;
use ferroccl::ffi::query::ncclGetLastError;
use ferroccl::types::{ncclComm_t, ncclResult_t};

use crate::json::{self, Json};
use crate::procs::{MpiSession, Procs};
use crate::psk::{self, Psk};
use crate::relay;
use crate::world::World;

/// Environment variable that carries the key to the encrypted phase's process.
pub const PSK_VAR: &str = "FERROCCL_BENCH_CANARY_PSK";

/// `--max-loss` default, in percent of plaintext busbw.
pub const DEFAULT_MAX_LOSS: f64 = 5.0;

/// Exit statuses, consistent with the rest of the benchmark.
const EXIT_PASS: i32 = 0;
/// The loss exceeded `--max-loss` (or a phase found wrong results).
const EXIT_FAIL: i32 = 1;
/// Usage or setup errors, including a measurement the reports show to be invalid.
const EXIT_SETUP: i32 = 2;
/// An NCCL call failed in a phase.
const EXIT_NCCL: i32 = 3;

/// Room for one encryption report (a few hundred bytes in practice).
const REPORT_BUFFER: usize = 64 << 10;

#[derive(Clone, Copy, PartialEq, Eq, Debug, clap::ValueEnum)]
pub enum Phase {
    Plaintext,
    Encrypted,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Plaintext => "plaintext",
            Phase::Encrypted => "encrypted",
        }
    }
}

// ---------------------------------------------------------------------------------------
// Child side: helpers for a phase process.

/// The library's encryption report for `comm` (src/tls.rs `Coverage::json`): one line of JSON.
pub fn encryption_report(comm: ncclComm_t) -> Result<String, String> {
    let mut buf = vec![0u8; REPORT_BUFFER];
    // A Rust export, so a safe call; the library writes at most `buf.len()` bytes, NUL
    // included, and nothing at all on error.
    let r = ferrocclCommEncryptionReport(comm, buf.as_mut_ptr().cast::<c_char>(), buf.len());
    if r != ncclResult_t::ncclSuccess {
        let why = crate::cstr(ncclGetLastError(std::ptr::null_mut()));
        return Err(format!("ferrocclCommEncryptionReport failed: {why}"));
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let text = std::str::from_utf8(&buf[..end]).map_err(|_| "encryption report is not UTF-8".to_string())?;
    // Line breaks in JSON are only ever whitespace: keep the report on one line.
    Ok(text.replace('\n', " "))
}

/// Every rank's report (process 0; the others get none), from each process's own ranks'.
pub fn gather_reports(world: &World, local: &[String]) -> Result<Vec<Json>, String> {
    let Some(all) = world.gather_text(&local.join("\n")) else {
        return Ok(Vec::new());
    };
    all.iter()
        .flat_map(|text| text.lines())
        .map(|line| json::parse(line).map_err(|e| format!("encryption report: {e}")))
        .collect()
}

/// A phase process dies with its parent (say, when mpirun aborts the job) instead of lingering.
pub fn die_with_parent() {
    // SAFETY: prctl(PR_SET_PDEATHSIG) only records a signal number for this process.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
}

/// The key of the encrypted phase, from the parent.
pub fn phase_psk(phase: Phase) -> Result<Option<Psk>, String> {
    match phase {
        Phase::Plaintext => Ok(None),
        Phase::Encrypted => Psk::from_env(PSK_VAR).map(Some),
    }
}

// ---------------------------------------------------------------------------------------
// Parent side.

/// What the parent needs from the command line (the rest goes to the phases unchanged).
pub struct CanaryConfig<'a> {
    pub max_loss: f64,
    /// Alternating plaintext/encrypted runs; per-phase medians are judged.
    pub rounds: u32,
    pub psk_env: Option<&'a str>,
    pub output_file: Option<&'a Path>,
    pub run_cycles: u32,
    pub maxbytes: usize,
    pub under_mpi: bool,
}

/// Runs both phases and the comparison; returns the exit status.
pub fn run(config: &CanaryConfig) -> i32 {
    let session = match check_usage(config).and_then(|()| MpiSession::start(config.under_mpi)) {
        Ok(session) => session,
        Err(message) => return report_failure(Failure::from(message)),
    };
    let procs = session.procs();
    match canary(config, &procs) {
        Ok(code) => code,
        // Under MPI the other processes may be waiting for this one in a call: end the job.
        Err(failure) if procs.nprocs() > 1 => procs.abort(report_failure(failure)),
        Err(failure) => report_failure(failure),
    }
}

fn report_failure(failure: Failure) -> i32 {
    let _ = std::io::stdout().flush();
    eprintln!("ferroccl-bench: canary: {}", failure.message);
    failure.code
}

/// Why the canary stopped without a verdict.
#[derive(Debug)]
struct Failure {
    code: i32,
    message: String,
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure { code: EXIT_SETUP, message }
    }
}

fn canary(config: &CanaryConfig, procs: &Procs) -> Result<i32, Failure> {
    let key = phase_key(config.psk_env, procs)?;
    // Fail before the plaintext phase rather than after it when the build cannot encrypt.
    psk::check_tls_support(&key)?;
    let scratch = ScratchDir::create()?;
    let mut rounds = Vec::new();
    for round in 0..config.rounds {
        if config.rounds > 1 && procs.index() == 0 {
            println!("# Encryption canary: round {} of {}", round + 1, config.rounds);
        }
        let plain = run_phase(Phase::Plaintext, None, &scratch, procs)?;
        let enc = run_phase(Phase::Encrypted, Some(&key), &scratch, procs)?;
        if let (Some(plain), Some(enc)) = (plain, enc) {
            rounds.push((plain, enc));
        }
    }
    drop(key);
    let code = if rounds.is_empty() {
        EXIT_PASS // not process 0: it tells the verdict
    } else {
        conclude(rounds, config)
    };
    Ok(share_exit_code(code, procs))
}

/// The encrypted phase's key: --psk-env's (every process reads its own environment: pass it
/// with `mpirun -x VAR`), else a fresh random one, made by process 0 and sent to the others
/// over MPI (in the clear: it protects nothing but this measurement).
fn phase_key(psk_env: Option<&str>, procs: &Procs) -> Result<Psk, String> {
    if let Some(var) = psk_env {
        return Psk::from_env(var);
    }
    let mut text = [0u8; psk::GENERATED_KEY_LEN];
    if procs.index() == 0 {
        text.copy_from_slice(Psk::generate()?.as_bytes());
    }
    procs.broadcast(&mut text);
    let key = Psk::from_bytes(&text, "generated key");
    text.fill(0);
    key
}

/// Compares the phases (per-phase medians over the rounds), prints the summary, writes -J;
/// the exit status.
fn conclude(rounds: Vec<(PhaseRun, PhaseRun)>, config: &CanaryConfig) -> i32 {
    let (outcome, per_round) = evaluate_rounds(&rounds, config.max_loss);
    let (plain, enc) = &rounds[0];
    print_summary(plain, enc, &outcome, config.max_loss);
    if rounds.len() > 1 {
        print_rounds(&per_round);
    }
    if let Some(path) = config.output_file {
        write_json(path, plain, enc, &outcome, config.max_loss, &per_round);
    }
    match &outcome {
        Outcome::Invalid(reason) => report_failure(format!("invalid measurement: {reason}").into()),
        Outcome::Judged(verdict, _) if verdict.pass => EXIT_PASS,
        Outcome::Judged(..) => EXIT_FAIL,
    }
}

/// Process 0's exit status, for every process (mpirun reports the first non-zero one).
fn share_exit_code(code: i32, procs: &Procs) -> i32 {
    let mut bytes = code.to_le_bytes();
    procs.broadcast(&mut bytes);
    i32::from_le_bytes(bytes)
}

fn check_usage(config: &CanaryConfig) -> Result<(), String> {
    if !(config.max_loss.is_finite() && config.max_loss >= 0.0) {
        return Err(format!("--max-loss must be a percentage >= 0, not {}", config.max_loss));
    }
    if config.run_cycles == 0 {
        return Err("--canary needs a finite run (-N 1 or more)".into());
    }
    if config.maxbytes == 0 {
        return Err("--canary compares bandwidth: the largest size (-e) must be above 0".into());
    }
    // Under the strict policy the plaintext phase cannot run (the library refuses plaintext).
    if std::env::var("FERROCCL_ENCRYPTION_POLICY").is_ok_and(|p| p.trim().eq_ignore_ascii_case("strict")) {
        return Err("FERROCCL_ENCRYPTION_POLICY=strict forbids the plaintext phase; unset it (NCCL_SHM_DISABLE=1 \
                    keeps both phases on sockets)"
            .into());
    }
    Ok(())
}

/// A private directory for the phases' result files, removed on drop.
struct ScratchDir(PathBuf);

impl ScratchDir {
    fn create() -> Result<ScratchDir, String> {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!("ferroccl-bench-canary-{}-{nanos}", std::process::id()));
        // Mode 0700 and create-new: nobody else can plant or read the files.
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&path)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        Ok(ScratchDir(path))
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One phase's results as its child reported them.
#[derive(Clone)]
struct PhaseRun {
    phase: Phase,
    doc: Json,
    rows: Vec<Row>,
    coverage: Coverage,
}

/// One row of a phase's table, the out-of-place measurement (the one compared).
#[derive(Clone, Debug, PartialEq)]
struct Row {
    key: RowKey,
    busbw: f64,
    time_us: f64,
    p99_us: f64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct RowKey {
    size: u64,
    dtype: String,
    redop: String,
    root: i64,
}

/// Runs one phase; its results on process 0 (None elsewhere).
fn run_phase(
    phase: Phase,
    key: Option<&Psk>,
    scratch: &ScratchDir,
    procs: &Procs,
) -> Result<Option<PhaseRun>, Failure> {
    let out = scratch.0.join(format!("{}.json", phase.name()));
    if procs.index() == 0 {
        println!("# Encryption canary: {} phase", phase.name());
        let _ = std::io::stdout().flush();
    }
    let cmd = phase_command(phase, key, &out)?;
    let status = if procs.nprocs() > 1 {
        run_relayed(cmd, &scratch.0.join(format!("{}.sock", phase.name())), procs)
    } else {
        run_alone(cmd)
    };
    let status = status.map_err(|e| format!("the {} phase: {e}", phase.name()))?;
    if !status.success() {
        return Err(phase_failure(phase, status.code()));
    }
    if procs.index() != 0 {
        return Ok(None);
    }
    read_phase(phase, &out).map(Some).map_err(|e| format!("the {} phase's results: {e}", phase.name()).into())
}

fn run_alone(mut cmd: Command) -> Result<ExitStatus, String> {
    cmd.status().map_err(|e| format!("cannot start: {e}"))
}

/// Runs a phase whose process-level calls this process makes for it (under MPI).
fn run_relayed(mut cmd: Command, socket: &Path, procs: &Procs) -> Result<ExitStatus, String> {
    // The previous round's socket (our own private directory) is in the way of bind.
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket).map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?;
    // Polled, so that a phase that fails before it connects is noticed.
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let mut child = cmd.arg("--canary-relay").arg(socket).spawn().map_err(|e| format!("cannot start: {e}"))?;
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).map_err(|e| e.to_string())?;
                relay::serve(stream, procs).map_err(|e| format!("relay: {e}"))?;
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                    return Ok(status);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => return Err(format!("relay: {e}")),
        }
    }
    child.wait().map_err(|e| e.to_string())
}

fn read_phase(phase: Phase, out: &Path) -> Result<PhaseRun, String> {
    let text = std::fs::read_to_string(out).map_err(|e| format!("cannot read {}: {e}", out.display()))?;
    let doc = json::parse(&text)?;
    let rows = rows_of(&doc)?;
    let reports = doc.get("encryption_reports").and_then(Json::as_array).map_or(&[][..], Vec::as_slice);
    let coverage = Coverage::from_reports(reports)?;
    Ok(PhaseRun { phase, doc, rows, coverage })
}

/// This binary with our own arguments (so the phases run exactly the same benchmark) plus the
/// phase flags; the key only through the environment, and only for the encrypted phase.
fn phase_command(phase: Phase, key: Option<&Psk>, out: &Path) -> Result<Command, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this program to run the phases: {e}"))?;
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1))
        .arg("--canary-phase")
        .arg(phase.name())
        .arg("--canary-out")
        .arg(out)
        .env_remove(PSK_VAR);
    if let Some(key) = key {
        cmd.env(PSK_VAR, key.as_os_str());
    }
    Ok(cmd)
}

fn phase_failure(phase: Phase, code: Option<i32>) -> Failure {
    let (code, what) = match code {
        Some(EXIT_FAIL) => (EXIT_FAIL, "found wrong results".to_string()),
        Some(EXIT_NCCL) => (EXIT_NCCL, "failed in an NCCL call".to_string()),
        Some(c) => (EXIT_SETUP, format!("exited with status {c}")),
        None => (EXIT_NCCL, "was killed by a signal".to_string()),
    };
    Failure { code, message: format!("the {} phase {what}; no comparison was made", phase.name()) }
}

/// The compared numbers of each row of a phase's JSON document.
fn rows_of(doc: &Json) -> Result<Vec<Row>, String> {
    let results = doc.get("results").and_then(Json::as_array).ok_or("no 'results' array")?;
    results.iter().map(row_of).collect()
}

fn row_of(result: &Json) -> Result<Row, String> {
    let text = |k: &str| result.get(k).and_then(Json::as_str).map(str::to_string).ok_or(format!("row without '{k}'"));
    let int = |k: &str| result.get(k).and_then(Json::as_i64).ok_or(format!("row without '{k}'"));
    let oop = result.get("oop").ok_or("row without 'oop'")?;
    let num = |k: &str| oop.get(k).and_then(Json::as_f64).ok_or(format!("row without 'oop.{k}'"));
    let latencies: Vec<f64> = oop
        .get("latencies_us")
        .and_then(Json::as_array)
        .ok_or("row without 'oop.latencies_us'")?
        .iter()
        .filter_map(Json::as_f64)
        .collect();
    Ok(Row {
        key: RowKey { size: int("size")? as u64, dtype: text("type")?, redop: text("redop")?, root: int("root")? },
        busbw: num("busbw")?,
        time_us: num("time_us")?,
        p99_us: p99(&latencies).ok_or("row without latency samples")?,
    })
}

/// The 99th percentile by the nearest-rank method: the smallest sample with at least 99 % of
/// the samples at or below it (the maximum below 100 samples). None without samples.
fn p99(samples: &[f64]) -> Option<f64> {
    let mut sorted: Vec<f64> = samples.iter().copied().filter(|x| !x.is_nan()).collect();
    if sorted.is_empty() {
        return None;
    }
    sorted.sort_by(f64::total_cmp);
    // ceil(0.99 * n) computed in integers, so 100 samples give exactly the 99th.
    let rank = (99 * sorted.len()).div_ceil(100);
    Some(sorted[rank.max(1) - 1])
}

/// Percent of plaintext busbw lost to encryption (negative when encrypted was faster); NaN
/// when there is no plaintext bandwidth to compare with.
fn loss_percent(plain_busbw: f64, enc_busbw: f64) -> f64 {
    if !(plain_busbw.is_finite() && plain_busbw > 0.0) {
        return f64::NAN;
    }
    (1.0 - enc_busbw / plain_busbw) * 100.0
}

/// What the reports of all ranks of one phase add up to.
#[derive(Clone, Debug, Default, PartialEq)]
struct Coverage {
    /// Reports read (one per rank).
    ranks: usize,
    /// Ranks whose process had a key configured.
    keyed_ranks: usize,
    /// TLS connections (bootstrap, unique-id root and data), counted at each rank.
    tls: u64,
    /// Connections without TLS, or whose protection the report does not name.
    plaintext: u64,
    /// Shared-memory connections (outside the TLS boundary).
    shm: u64,
    /// Data connections over TLS sockets.
    tls_data: u64,
    /// The TLS protections seen ("TLS1.3/TLS_AES_128_GCM_SHA256").
    security: Vec<String>,
}

impl Coverage {
    fn from_reports(reports: &[Json]) -> Result<Coverage, String> {
        if reports.is_empty() {
            return Err("no encryption report".into());
        }
        let mut total = Coverage::default();
        // `bootstrap_root` is the unique-id root, which lives in one process and is repeated
        // in the report of every rank of that process: count it once per communicator.
        let mut roots_seen: Vec<&str> = Vec::new();
        for report in reports {
            let comm = report.get("comm").and_then(Json::as_str).unwrap_or("");
            let first_of_comm = !roots_seen.contains(&comm);
            roots_seen.push(comm);
            total.add_report(report, first_of_comm).map_err(|e| format!("encryption report: {e}"))?;
        }
        Ok(total)
    }

    fn add_report(&mut self, report: &Json, with_root: bool) -> Result<(), String> {
        let field = |k: &str| report.get(k).ok_or(format!("no '{k}'"));
        self.ranks += 1;
        if field("encryption")?.as_str() == Some("psk") {
            self.keyed_ranks += 1;
        }
        let mut plaintext = 0;
        let lists: &[&str] = if with_root { &["bootstrap", "bootstrap_root"] } else { &["bootstrap"] };
        for &list in lists {
            for entry in field(list)?.as_array().ok_or(format!("'{list}' is not a list"))? {
                let count = count_of(entry)?;
                if entry.get("encrypted").and_then(Json::as_bool) == Some(true) {
                    self.add_tls(count, entry);
                } else {
                    plaintext += count;
                }
            }
        }
        let net = field("net")?;
        let net_count = count_of(net)?;
        let protections = net.get("security").and_then(Json::as_array).ok_or("'net' without 'security'")?;
        let all_tls = !protections.is_empty()
            && protections.iter().all(|s| s.get("encrypted").and_then(Json::as_bool) == Some(true));
        if all_tls {
            self.add_tls(net_count, &protections[0]);
            self.tls_data += net_count;
        } else {
            // Fail closed: one plaintext or unnamed protection makes them all suspect.
            plaintext += net_count;
        }
        // The library's own count must never be above ours.
        let reported = field("plaintext")?.as_i64().ok_or("'plaintext' is not a count")?.max(0) as u64;
        self.plaintext += plaintext.max(reported);
        self.shm += count_of(field("shm")?)?;
        Ok(())
    }

    fn add_tls(&mut self, count: u64, protection: &Json) {
        self.tls += count;
        let label = protection.get("security").and_then(Json::as_str).unwrap_or("TLS");
        if count > 0 && !self.security.iter().any(|s| s == label) {
            self.security.push(label.to_string());
        }
    }

    fn security_label(&self) -> String {
        if self.security.is_empty() {
            "no TLS".into()
        } else {
            self.security.join("|")
        }
    }

    fn json(&self) -> Json {
        json::obj(vec![
            ("ranks", Json::from(self.ranks as i64)),
            ("ranks_with_key", Json::from(self.keyed_ranks as i64)),
            ("tls_connections", Json::from(self.tls as i64)),
            ("tls_data_connections", Json::from(self.tls_data as i64)),
            ("plaintext_connections", Json::from(self.plaintext as i64)),
            ("shm_connections", Json::from(self.shm as i64)),
            ("security", Json::Array(self.security.iter().map(|s| json::str(s.as_str())).collect())),
        ])
    }
}

fn count_of(entry: &Json) -> Result<u64, String> {
    let n = entry.get("count").and_then(Json::as_i64).ok_or("an entry without 'count'")?;
    u64::try_from(n).map_err(|_| format!("negative count {n}"))
}

/// Refuses a measurement whose phases were not what they claim; otherwise the warnings that
/// go with it.
fn check_coverage(plain: &Coverage, enc: &Coverage) -> Result<Vec<String>, String> {
    if enc.keyed_ranks != enc.ranks {
        return Err(format!(
            "{} of {} ranks of the encrypted phase had no key configured",
            enc.ranks - enc.keyed_ranks,
            enc.ranks
        ));
    }
    if enc.plaintext > 0 {
        return Err(format!("the encrypted phase had {} plaintext connections", enc.plaintext));
    }
    if enc.tls == 0 {
        return Err("the encrypted phase had no TLS connection".into());
    }
    // Only the bootstrap encrypted: the phases measured the same unencrypted data path.
    if enc.tls_data == 0 {
        let why = if enc.shm > 0 { "all data went over shared memory: set NCCL_SHM_DISABLE=1" } else { "one rank?" };
        return Err(format!("no data connection of the encrypted phase used TLS ({why})"));
    }
    if plain.keyed_ranks > 0 || plain.tls > 0 {
        return Err(format!(
            "the plaintext phase was encrypted ({} TLS connections, {} ranks with a key)",
            plain.tls, plain.keyed_ranks
        ));
    }
    // Some data over shared memory (ranks sharing a host) dilutes the comparison.
    let mut warnings = Vec::new();
    for (name, c) in [("plaintext", plain), ("encrypted", enc)] {
        if c.shm > 0 {
            warnings.push(format!(
                "shared memory carried data in the {name} phase ({} connections, outside TLS): the comparison is \
                 meant for sockets; set NCCL_SHM_DISABLE=1",
                c.shm
            ));
        }
    }
    Ok(warnings)
}

/// One row compared across the phases.
#[derive(Clone, Debug, PartialEq)]
struct Comparison {
    plain: Row,
    enc: Row,
    loss: f64,
}

fn compare_rows(plain: &[Row], enc: &[Row]) -> Result<Vec<Comparison>, String> {
    if plain.is_empty() || plain.len() != enc.len() {
        return Err(format!("the phases measured different rows ({} and {})", plain.len(), enc.len()));
    }
    plain
        .iter()
        .zip(enc)
        .map(|(p, e)| {
            if p.key != e.key {
                return Err(format!("the phases measured different rows ({:?} and {:?})", p.key, e.key));
            }
            Ok(Comparison { plain: p.clone(), enc: e.clone(), loss: loss_percent(p.busbw, e.busbw) })
        })
        .collect()
}

/// The verdict: the largest size decides (small sizes are latency-bound and noisy); when
/// several rows have that size (types, operators, roots, cycles), the worst of them.
#[derive(Clone, Debug, PartialEq)]
struct Verdict {
    comparisons: Vec<Comparison>,
    /// Index of the deciding row.
    decisive: usize,
    pass: bool,
}

fn judge(comparisons: Vec<Comparison>, max_loss: f64) -> Verdict {
    let largest = comparisons.iter().map(|c| c.plain.key.size).max().unwrap_or(0);
    let decisive = comparisons
        .iter()
        .enumerate()
        .filter(|(_, c)| c.plain.key.size == largest)
        // A NaN loss (no plaintext bandwidth) counts as the worst.
        .max_by(|(_, a), (_, b)| loss_rank(a.loss).total_cmp(&loss_rank(b.loss)))
        .map_or(0, |(i, _)| i);
    let loss = comparisons.get(decisive).map_or(f64::NAN, |c| c.loss);
    Verdict { comparisons, decisive, pass: loss <= max_loss }
}

fn loss_rank(loss: f64) -> f64 {
    if loss.is_nan() {
        f64::INFINITY
    } else {
        loss
    }
}

enum Outcome {
    Judged(Verdict, Vec<String>),
    /// The reports or results make the measurement meaningless.
    Invalid(String),
}

impl Outcome {
    fn verdict_name(&self) -> &'static str {
        match self {
            Outcome::Judged(v, _) if v.pass => "PASS",
            Outcome::Judged(..) => "FAIL",
            Outcome::Invalid(_) => "INVALID",
        }
    }
}

/// Every round must be valid on its own; the verdict then compares, row by row, the median
/// over the rounds of each phase's numbers. Also returns each round's deciding-size loss.
fn evaluate_rounds(rounds: &[(PhaseRun, PhaseRun)], max_loss: f64) -> (Outcome, Vec<f64>) {
    let mut per_round = Vec::with_capacity(rounds.len());
    for (plain, enc) in rounds {
        match evaluate(plain, enc, max_loss) {
            Outcome::Judged(verdict, _) => per_round.push(verdict.comparisons[verdict.decisive].loss),
            invalid => return (invalid, per_round),
        }
    }
    let (first_plain, first_enc) = &rounds[0];
    let plain_rounds: Vec<&[Row]> = rounds.iter().map(|(p, _)| p.rows.as_slice()).collect();
    let enc_rounds: Vec<&[Row]> = rounds.iter().map(|(_, e)| e.rows.as_slice()).collect();
    let medians = median_rows(&plain_rounds).and_then(|p| Ok((p, median_rows(&enc_rounds)?)));
    let outcome = match medians {
        Ok((plain_rows, enc_rows)) => {
            let plain = PhaseRun { rows: plain_rows, ..first_plain.clone() };
            let enc = PhaseRun { rows: enc_rows, ..first_enc.clone() };
            evaluate(&plain, &enc, max_loss)
        }
        Err(reason) => Outcome::Invalid(reason),
    };
    (outcome, per_round)
}

/// Row by row, the median over rounds of busbw, time and p99 (each on its own); the rounds
/// must have measured the same rows.
fn median_rows(rounds: &[&[Row]]) -> Result<Vec<Row>, String> {
    let first = rounds.first().ok_or("no round")?;
    if rounds.iter().any(|r| r.len() != first.len() || r.iter().zip(first.iter()).any(|(a, b)| a.key != b.key)) {
        return Err("the rounds measured different rows".into());
    }
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    };
    Ok((0..first.len())
        .map(|i| Row {
            key: first[i].key.clone(),
            busbw: median(rounds.iter().map(|r| r[i].busbw).collect()),
            time_us: median(rounds.iter().map(|r| r[i].time_us).collect()),
            p99_us: median(rounds.iter().map(|r| r[i].p99_us).collect()),
        })
        .collect())
}

/// The deciding size's loss in each round, below the summary.
fn print_rounds(per_round: &[f64]) {
    let list: Vec<String> = per_round.iter().map(|l| format!("{l:.1}")).collect();
    println!(
        "#   rounds    : {} (loss per round, %: {}); the verdict compares per-phase medians",
        per_round.len(),
        list.join(", ")
    );
    let _ = std::io::stdout().flush();
}

fn evaluate(plain: &PhaseRun, enc: &PhaseRun, max_loss: f64) -> Outcome {
    let warnings = match check_coverage(&plain.coverage, &enc.coverage) {
        Ok(w) => w,
        Err(reason) => return Outcome::Invalid(reason),
    };
    match compare_rows(&plain.rows, &enc.rows) {
        Ok(comparisons) => Outcome::Judged(judge(comparisons, max_loss), warnings),
        Err(reason) => Outcome::Invalid(reason),
    }
}

fn print_summary(plain: &PhaseRun, enc: &PhaseRun, outcome: &Outcome, max_loss: f64) {
    println!("#");
    let (verdict, warnings) = match outcome {
        Outcome::Judged(verdict, warnings) => (verdict, warnings),
        Outcome::Invalid(reason) => {
            println!("# Encryption canary: INVALID: {reason}");
            let _ = std::io::stdout().flush();
            return;
        }
    };
    if verdict.comparisons.len() > 1 {
        print_rows(verdict);
    }
    let decisive = &verdict.comparisons[verdict.decisive];
    let key = &decisive.plain.key;
    let ranks = plain.doc.get("ranks").and_then(Json::as_i64).unwrap_or(0);
    let collective = plain.doc.get("collective").and_then(Json::as_str).unwrap_or("?");
    println!("# Encryption canary: {collective} {} {} B, {ranks} ranks", key.dtype, key.size);
    println!("#   plaintext : {}", phase_numbers(&decisive.plain));
    println!(
        "#   encrypted : {}  ({}, {} connections)",
        phase_numbers(&decisive.enc),
        enc.coverage.security_label(),
        enc.coverage.tls
    );
    println!(
        "#   loss      : {:.1} % busbw (max allowed {} %) -> {}",
        decisive.loss,
        crate::fmt::c_g(max_loss),
        outcome.verdict_name()
    );
    for w in warnings {
        println!("#   WARNING   : {w}");
    }
    let _ = std::io::stdout().flush();
}

fn phase_numbers(row: &Row) -> String {
    format!("busbw {:7.2} GB/s  p99 {:9.1} us", row.busbw, row.p99_us)
}

/// Every row, when there are several (the summary block shows the deciding one).
fn print_rows(verdict: &Verdict) {
    println!("# Encryption canary, every row (out-of-place busbw in GB/s, p99 in us; the largest size decides):");
    println!(
        "# {:>12}  {:>8}  {:>6}  {:>4}  {:>11}  {:>11}  {:>11}  {:>11}  {:>7}",
        "size", "type", "redop", "root", "plain busbw", "enc busbw", "plain p99", "enc p99", "loss %"
    );
    for c in &verdict.comparisons {
        let k = &c.plain.key;
        println!(
            "# {:>12}  {:>8}  {:>6}  {:>4}  {:>11.2}  {:>11.2}  {:>11.1}  {:>11.1}  {:>7.1}",
            k.size, k.dtype, k.redop, k.root, c.plain.busbw, c.enc.busbw, c.plain.p99_us, c.enc.p99_us, c.loss
        );
    }
    println!("#");
}

fn write_json(path: &Path, plain: &PhaseRun, enc: &PhaseRun, outcome: &Outcome, max_loss: f64, per_round: &[f64]) {
    let mut fields = vec![
        ("program", json::str("ferroccl-bench")),
        ("version", json::str(env!("CARGO_PKG_VERSION"))),
        ("mode", json::str("encryption_canary")),
        ("command_line", json::str(std::env::args().collect::<Vec<_>>().join(" "))),
        ("date", json::str(crate::now_string())),
        ("collective", plain.doc.get("collective").cloned().unwrap_or(Json::Null)),
        ("ranks", plain.doc.get("ranks").cloned().unwrap_or(Json::Null)),
        ("max_loss_percent", Json::from(max_loss)),
        ("verdict_basis", json::str("out-of-place busbw of the largest size (the worst row of that size)")),
        ("verdict", json::str(outcome.verdict_name())),
        ("rounds", Json::from(per_round.len().max(1) as i64)),
        ("loss_percent_per_round", Json::Array(per_round.iter().map(|l| Json::from(*l)).collect())),
    ];
    match outcome {
        Outcome::Judged(verdict, warnings) => {
            fields.push(("loss_percent", Json::from(verdict.comparisons[verdict.decisive].loss)));
            fields.push(("comparisons", Json::Array(verdict.comparisons.iter().map(comparison_json).collect())));
            fields.push(("warnings", Json::Array(warnings.iter().map(|s| json::str(s.as_str())).collect())));
        }
        Outcome::Invalid(reason) => fields.push(("reason", json::str(reason.clone()))),
    }
    fields.push((
        "encryption",
        json::obj(vec![("plaintext", plain.coverage.json()), ("encrypted", enc.coverage.json())]),
    ));
    fields.push((
        "phases",
        json::obj(vec![(plain.phase.name(), plain.doc.clone()), (enc.phase.name(), enc.doc.clone())]),
    ));
    match std::fs::write(path, json::render(&json::obj(fields))) {
        Ok(()) => println!("# Wrote JSON output to {}", path.display()),
        Err(e) => eprintln!("ferroccl-bench: cannot write {}: {e}", path.display()),
    }
}

fn comparison_json(c: &Comparison) -> Json {
    let numbers = |r: &Row| {
        json::obj(vec![
            ("busbw", Json::from(r.busbw)),
            ("time_us", Json::from(r.time_us)),
            ("p99_us", Json::from(r.p99_us)),
        ])
    };
    let k = &c.plain.key;
    json::obj(vec![
        ("size", Json::from(k.size as i64)),
        ("type", json::str(k.dtype.clone())),
        ("redop", json::str(k.redop.clone())),
        ("root", Json::from(k.root)),
        ("plaintext", numbers(&c.plain)),
        ("encrypted", numbers(&c.enc)),
        ("loss_percent", Json::from(c.loss)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(size: u64, dtype: &str, busbw: f64) -> Row {
        Row {
            key: RowKey { size, dtype: dtype.into(), redop: "sum".into(), root: -1 },
            busbw,
            time_us: 1.0,
            p99_us: 2.0,
        }
    }

    #[test]
    fn p99_is_the_nearest_rank() {
        assert_eq!(p99(&[]), None);
        assert_eq!(p99(&[7.0]), Some(7.0));
        // Below 100 samples the nearest rank is the maximum.
        assert_eq!(p99(&[3.0, 1.0, 2.0, 10.0, 4.0]), Some(10.0));
        let hundred: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(p99(&hundred), Some(99.0));
        let two_hundred: Vec<f64> = (1..=200).map(f64::from).collect();
        assert_eq!(p99(&two_hundred), Some(198.0));
        assert_eq!(p99(&[f64::NAN, 5.0]), Some(5.0));
    }

    #[test]
    fn rounds_are_combined_row_by_row_into_medians() {
        let with = |busbw: f64, time_us: f64, p99_us: f64| Row { busbw, time_us, p99_us, ..row(64, "float", 0.0) };
        let rounds = [vec![with(3.0, 30.0, 90.0)], vec![with(1.0, 10.0, 50.0)], vec![with(2.0, 99.0, 70.0)]];
        let slices: Vec<&[Row]> = rounds.iter().map(Vec::as_slice).collect();
        // Each number is its own median: the middle busbw, time and p99 need not share a round.
        assert_eq!(median_rows(&slices).unwrap(), vec![with(2.0, 30.0, 70.0)]);
        // An even count averages the middle two.
        assert_eq!(median_rows(&slices[..2]).unwrap(), vec![with(2.0, 20.0, 70.0)]);
        assert_eq!(median_rows(&slices[..1]).unwrap(), rounds[0]);
        // Rounds that measured different rows cannot be combined.
        let other = [row(128, "float", 1.0)];
        assert!(median_rows(&[slices[0], &other]).is_err());
        assert!(median_rows(&[slices[0], &[]]).is_err());
    }

    #[test]
    fn loss_is_relative_to_plaintext() {
        assert!((loss_percent(10.0, 9.0) - 10.0).abs() < 1e-9);
        assert!((loss_percent(10.0, 12.5) + 25.0).abs() < 1e-9);
        assert_eq!(loss_percent(4.0, 4.0), 0.0);
        assert!(loss_percent(0.0, 1.0).is_nan());
    }

    #[test]
    fn the_largest_size_decides_and_equal_to_the_threshold_passes() {
        let plain = [row(1 << 20, "float", 4.0), row(64 << 20, "float", 4.0)];
        // 75 % loss at 1 MiB does not count; 25 % at 64 MiB is exactly the threshold.
        let enc = [row(1 << 20, "float", 1.0), row(64 << 20, "float", 3.0)];
        let v = judge(compare_rows(&plain, &enc).unwrap(), 25.0);
        assert_eq!(v.decisive, 1);
        assert_eq!(v.comparisons[1].loss, 25.0);
        assert!(v.pass);
        let v = judge(compare_rows(&plain, &enc).unwrap(), 24.9);
        assert!(!v.pass);
    }

    #[test]
    fn the_worst_row_of_the_largest_size_decides() {
        let plain = [row(8 << 20, "float", 10.0), row(8 << 20, "double", 10.0), row(8 << 20, "half", 0.0)];
        let enc = [row(8 << 20, "float", 9.9), row(8 << 20, "double", 8.0), row(8 << 20, "half", 1.0)];
        let v = judge(compare_rows(&plain[..2], &enc[..2]).unwrap(), 5.0);
        assert_eq!((v.decisive, v.pass), (1, false));
        // No plaintext bandwidth: no comparison, never a pass.
        let v = judge(compare_rows(&plain, &enc).unwrap(), 1000.0);
        assert_eq!((v.decisive, v.pass), (2, false));
        // A faster encrypted phase (negative loss) passes any threshold.
        let v = judge(compare_rows(&plain[..1], &[row(8 << 20, "float", 11.0)]).unwrap(), 0.0);
        assert!(v.pass);
    }

    #[test]
    fn mismatched_rows_are_refused() {
        let plain = [row(1024, "float", 1.0)];
        assert!(compare_rows(&plain, &[]).is_err());
        assert!(compare_rows(&plain, &[row(2048, "float", 1.0)]).is_err());
        assert!(compare_rows(&[], &[]).is_err());
    }

    /// A report as src/tls.rs `Coverage::json` writes it (the unique-id root with as many
    /// connections as the rank's own bootstrap entry).
    fn report(key: bool, boot_tls: bool, net: (u64, &str), shm: u64) -> Json {
        let boot = if boot_tls {
            r#"{"count":2,"encrypted":true,"security":"TLS1.3/TLS_AES_128_GCM_SHA256","protocol":"TLS1.3","cipher":"TLS_AES_128_GCM_SHA256","key_exchange":"psk_dhe_ke/X25519"}"#
        } else {
            r#"{"count":2,"encrypted":false,"security":"plaintext"}"#
        };
        let net_security = match net.1 {
            "tls" => r#"{"encrypted":true,"security":"TLS1.3/TLS_AES_128_GCM_SHA256"}"#,
            "plain" => r#"{"encrypted":false,"security":"plaintext"}"#,
            "mixed" => {
                r#"{"encrypted":true,"security":"TLS1.3/TLS_AES_128_GCM_SHA256"},{"encrypted":false,"security":"plaintext"}"#
            }
            _ => "",
        };
        let plaintext = if boot_tls { 0 } else { 2 } + if net.1 == "tls" { 0 } else { net.0 };
        json::parse(&format!(
            r#"{{"comm":"0x0000000000000001","rank":0,"nranks":2,"encryption":"{}","policy":"default","bootstrap":[{boot}],"bootstrap_root":[{boot}],"net":{{"transport":"NET/Socket","count":{},"security":[{net_security}]}},"shm":{{"count":{shm},"encrypted":false,"note":"outside TLS boundary"}},"plaintext":{plaintext},"rekeys":0}}"#,
            if key { "psk" } else { "none" },
            net.0
        ))
        .unwrap()
    }

    fn coverage(reports: &[Json]) -> Coverage {
        Coverage::from_reports(reports).unwrap()
    }

    #[test]
    fn reports_add_up_over_ranks() {
        let tls = report(true, true, (2, "tls"), 0);
        // Per rank 2 bootstrap + 2 data connections; the root's 2 once (same communicator).
        let c = coverage(&[tls.clone(), tls]);
        assert_eq!((c.ranks, c.keyed_ranks, c.tls, c.tls_data, c.plaintext, c.shm), (2, 2, 10, 4, 0, 0));
        assert_eq!(c.security_label(), "TLS1.3/TLS_AES_128_GCM_SHA256");
        let plain = coverage(&[report(false, false, (2, "plain"), 1)]);
        assert_eq!((plain.tls, plain.plaintext, plain.shm), (0, 6, 1));
        // Data connections of unnamed or mixed protection count as plaintext (fail closed).
        assert_eq!(coverage(&[report(true, true, (2, "none"), 0)]).plaintext, 2);
        assert_eq!(coverage(&[report(true, true, (2, "mixed"), 0)]).plaintext, 2);
        assert!(Coverage::from_reports(&[]).is_err());
        assert!(Coverage::from_reports(&[json::parse("{}").unwrap()]).is_err());
    }

    #[test]
    fn a_real_pair_of_phases_is_accepted() {
        let plain = coverage(&[report(false, false, (2, "plain"), 0)]);
        let enc = coverage(&[report(true, true, (2, "tls"), 0)]);
        assert_eq!(check_coverage(&plain, &enc), Ok(vec![]));
    }

    #[test]
    fn an_encrypted_phase_with_plaintext_or_without_tls_is_refused() {
        let plain = coverage(&[report(false, false, (2, "plain"), 0)]);
        let leaky = coverage(&[report(true, true, (2, "plain"), 0)]);
        assert!(check_coverage(&plain, &leaky).unwrap_err().contains("2 plaintext connections"));
        // Measured plaintext twice.
        assert!(check_coverage(&plain, &plain).is_err());
        let unkeyed = coverage(&[report(true, true, (2, "tls"), 0), report(false, true, (2, "tls"), 0)]);
        assert!(check_coverage(&plain, &unkeyed).unwrap_err().contains("no key"));
        let mut no_tls = coverage(&[report(true, true, (2, "tls"), 0)]);
        no_tls.tls = 0;
        no_tls.security.clear();
        assert!(check_coverage(&plain, &no_tls).unwrap_err().contains("no TLS connection"));
    }

    #[test]
    fn an_encrypted_plaintext_phase_is_refused() {
        let enc = coverage(&[report(true, true, (2, "tls"), 0)]);
        assert!(check_coverage(&enc, &enc).unwrap_err().contains("plaintext phase was encrypted"));
        let tls_without_key = coverage(&[report(false, true, (2, "tls"), 0)]);
        assert!(check_coverage(&tls_without_key, &enc).is_err());
    }

    #[test]
    fn some_shared_memory_is_a_warning() {
        let plain = coverage(&[report(false, false, (2, "plain"), 2)]);
        let enc = coverage(&[report(true, true, (2, "tls"), 2)]);
        let warnings = check_coverage(&plain, &enc).unwrap();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[0].contains("plaintext phase") && warnings[0].contains("NCCL_SHM_DISABLE=1"));
        assert!(warnings[1].contains("encrypted phase"));
    }

    #[test]
    fn only_shared_memory_for_data_is_refused() {
        // TLS bootstrap, but every data byte over shared memory: both phases measured SHM.
        let plain = coverage(&[report(false, false, (0, "none"), 2)]);
        let enc = coverage(&[report(true, true, (0, "none"), 2)]);
        let refusal = check_coverage(&plain, &enc).unwrap_err();
        assert!(refusal.contains("no data connection") && refusal.contains("NCCL_SHM_DISABLE=1"), "{refusal}");
    }

    #[test]
    fn phase_exit_statuses_map_to_ours() {
        assert_eq!(phase_failure(Phase::Encrypted, Some(1)).code, EXIT_FAIL);
        assert_eq!(phase_failure(Phase::Encrypted, Some(3)).code, EXIT_NCCL);
        assert_eq!(phase_failure(Phase::Plaintext, Some(2)).code, EXIT_SETUP);
        assert_eq!(phase_failure(Phase::Plaintext, None).code, EXIT_NCCL);
        assert!(phase_failure(Phase::Plaintext, Some(2)).message.contains("plaintext phase"));
    }

    #[test]
    fn usage_is_checked_before_anything_runs() {
        let ok = || CanaryConfig {
            max_loss: 5.0,
            rounds: 1,
            psk_env: None,
            output_file: None,
            run_cycles: 1,
            maxbytes: 1,
            under_mpi: false,
        };
        assert!(check_usage(&ok()).is_ok());
        assert!(check_usage(&CanaryConfig { run_cycles: 0, ..ok() }).unwrap_err().contains("-N"));
        assert!(check_usage(&CanaryConfig { maxbytes: 0, ..ok() }).unwrap_err().contains("-e"));
        assert!(check_usage(&CanaryConfig { max_loss: -1.0, ..ok() }).is_err());
        assert!(check_usage(&CanaryConfig { max_loss: f64::NAN, ..ok() }).is_err());
    }
}

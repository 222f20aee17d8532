//! NCCL-compatible logging through the `log` crate.
//!
//! Owns: the process logger (a `log::Log` implementation), `NCCL_DEBUG`,
//! `NCCL_DEBUG_SUBSYS` and `NCCL_DEBUG_FILE` handling, NCCL's line formats, the version
//! banner, and the last WARN text (for `ncclGetLastError`). Configuration comes only from
//! [`crate::env`].
//!
//! Code logs with the subsystem as the target: `log::info!(target: "NET", "...")`. Targets
//! are the names in [`SUBSYSTEMS`] (INIT COLL P2P SHM NET GRAPH TUNING ENV ALLOC CALL PROXY
//! NVLS BOOTSTRAP REG PROFILE RAS DESTROY, ...) and `ALL`; any other target (such as the
//! default module path) counts as INIT. `error!`/`warn!` print as NCCL WARN, `info!` as INFO, `debug!`/`trace!` as TRACE.
//!
//! Invariants: every WARN record is remembered in [`last_warning`], even when `NCCL_DEBUG` is
//! unset (the logger keeps `log`'s max level at least `Warn`); each line reaches the sink in
//! one locked write followed by a flush, so lines from different threads never interleave.

use std::cell::Cell;
use std::fs::File;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, Once, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use log::{Level, LevelFilter, Log, Metadata, Record};

use crate::env::Snapshot;

/// Subsystem names and their NCCL flag bits (`ncclDebugLogSubSys`; `ALLOC_HOST` and
/// `DESTROY` have no NCCL value in our reference and take the next free bits).
pub const SUBSYSTEMS: &[(&str, u64)] = &[
    ("INIT", 0x1),
    ("COLL", 0x2),
    ("P2P", 0x4),
    ("SHM", 0x8),
    ("NET", 0x10),
    ("GRAPH", 0x20),
    ("TUNING", 0x40),
    ("ENV", 0x80),
    ("ALLOC", 0x100),
    ("CALL", 0x200),
    ("PROXY", 0x400),
    ("NVLS", 0x800),
    ("BOOTSTRAP", 0x1000),
    ("REG", 0x2000),
    ("PROFILE", 0x4000),
    ("RAS", 0x8000),
    ("ALLOC_HOST", 0x1_0000),
    ("DESTROY", 0x2_0000),
];

/// NCCL's `NCCL_ALL`: every subsystem.
pub const ALL_SUBSYSTEMS: u64 = u64::MAX;

const INIT_FLAG: u64 = 0x1;

/// The flag bits of a log target: a subsystem name, `ALL`, or anything else (= INIT).
pub fn subsys_flags(target: &str) -> u64 {
    if target == "ALL" {
        return ALL_SUBSYSTEMS;
    }
    SUBSYSTEMS.iter().find(|(name, _)| *name == target).map_or(INIT_FLAG, |&(_, flag)| flag)
}

/// The target to log under for NCCL flag bits (e.g. from a net plugin's logger callback):
/// the name of the lowest set bit, or `ALL` when no known bit is set.
pub fn subsys_target(flags: u64) -> &'static str {
    SUBSYSTEMS.iter().find(|&&(_, flag)| flags & flag != 0).map_or("ALL", |&(name, _)| name)
}

/// `NCCL_DEBUG`, ordered from quietest to loudest.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum DebugLevel {
    /// Unset or unrecognized: nothing printed (WARN text is still remembered).
    Off,
    /// Only the version banner.
    Version,
    /// The banner and WARN lines (also `ABORT` and `ATTN`).
    Warn,
    /// Plus INFO lines of the selected subsystems.
    Info,
    /// Plus TRACE lines of the selected subsystems.
    Trace,
}

impl DebugLevel {
    /// Parses `NCCL_DEBUG` case-insensitively; unknown values are `Off`, as in NCCL.
    pub fn parse(value: Option<&str>) -> Self {
        let Some(value) = value else {
            return Self::Off;
        };
        match value.trim().to_ascii_uppercase().as_str() {
            "VERSION" => Self::Version,
            "WARN" | "ABORT" | "ATTN" => Self::Warn,
            "INFO" => Self::Info,
            "TRACE" => Self::Trace,
            _ => Self::Off,
        }
    }

    /// The `log` max level for this setting: never below `Warn`, so WARN text is kept.
    pub fn max_level(self) -> LevelFilter {
        match self {
            Self::Off | Self::Version | Self::Warn => LevelFilter::Warn,
            Self::Info => LevelFilter::Info,
            Self::Trace => LevelFilter::Trace,
        }
    }
}

/// Which subsystems print at INFO and TRACE (`NCCL_DEBUG_SUBSYS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubsysMask(pub u64);

impl SubsysMask {
    /// NCCL's default: `INIT,BOOTSTRAP,ENV`.
    pub const DEFAULT: Self = Self(0x1 | 0x1000 | 0x80);

    /// Parses a comma list of subsystem names (case-insensitive, `ALL` allowed); a leading
    /// `^` means every subsystem except those listed. Unknown names are ignored, as in NCCL.
    pub fn parse(spec: &str) -> Self {
        let spec = spec.trim();
        let (invert, list) = match spec.strip_prefix('^') {
            Some(rest) => (true, rest),
            None => (false, spec),
        };
        let mut mask = if invert { ALL_SUBSYSTEMS } else { 0 };
        for name in list.split(',').map(str::trim) {
            let flags = if name.eq_ignore_ascii_case("ALL") {
                ALL_SUBSYSTEMS
            } else {
                SUBSYSTEMS.iter().find(|(known, _)| known.eq_ignore_ascii_case(name)).map_or(0, |&(_, flag)| flag)
            };
            if invert {
                mask &= !flags;
            } else {
                mask |= flags;
            }
        }
        Self(mask)
    }

    /// Whether a line with these flag bits passes.
    pub fn allows(self, flags: u64) -> bool {
        self.0 & flags != 0
    }
}

/// The three kinds of line NCCL prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineKind {
    /// `NCCL WARN`, from `error!` and `warn!`.
    Warn,
    /// `NCCL INFO`, from `info!` (and the version banner).
    Info,
    /// `NCCL TRACE`, from `debug!` and `trace!`.
    Trace,
}

impl LineKind {
    fn of(level: Level) -> Self {
        match level {
            Level::Error | Level::Warn => Self::Warn,
            Level::Info => Self::Info,
            Level::Debug | Level::Trace => Self::Trace,
        }
    }
}

/// Logging configuration, parsed from an environment snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DebugConfig {
    /// `NCCL_DEBUG`.
    pub level: DebugLevel,
    /// `NCCL_DEBUG_SUBSYS` (INFO and TRACE only).
    pub mask: SubsysMask,
    /// `NCCL_DEBUG_FILE` before `%h`/`%p` expansion; `None` = stdout.
    pub file: Option<String>,
}

impl DebugConfig {
    /// Reads `NCCL_DEBUG`, `NCCL_DEBUG_SUBSYS` and `NCCL_DEBUG_FILE` from `env`.
    pub fn from_snapshot(env: &Snapshot) -> Self {
        let mask =
            env.get_str_or_default("NCCL_DEBUG_SUBSYS").map_or(SubsysMask::DEFAULT, |spec| SubsysMask::parse(&spec));
        Self {
            level: DebugLevel::parse(env.get_str("NCCL_DEBUG").as_deref()),
            mask,
            file: env.get_str("NCCL_DEBUG_FILE"),
        }
    }

    /// Whether a line of `kind` with subsystem `flags` is printed. WARN ignores the mask.
    pub fn prints(&self, kind: LineKind, flags: u64) -> bool {
        match kind {
            LineKind::Warn => self.level >= DebugLevel::Warn,
            LineKind::Info => self.level >= DebugLevel::Info && self.mask.allows(flags),
            LineKind::Trace => self.level >= DebugLevel::Trace && self.mask.allows(flags),
        }
    }

    /// Whether the version banner is printed: at VERSION and WARN always, at INFO and TRACE
    /// as an `ALL` INFO line (NCCL's `showVersion`).
    pub fn prints_banner(&self) -> bool {
        match self.level {
            DebugLevel::Off => false,
            DebugLevel::Version | DebugLevel::Warn => true,
            DebugLevel::Info | DebugLevel::Trace => self.mask.allows(ALL_SUBSYSTEMS),
        }
    }
}

/// Everything one log line shows. Fields a kind does not use are ignored.
#[derive(Clone, Copy, Debug)]
pub struct LineParts<'a> {
    /// WARN, INFO or TRACE.
    pub kind: LineKind,
    /// Host name, already cut at the first `.`.
    pub host: &'a str,
    /// Process id.
    pub pid: u32,
    /// Kernel thread id.
    pub tid: i64,
    /// CUDA device of the logging thread.
    pub dev: i32,
    /// Source file (WARN, TRACE).
    pub file: &'a str,
    /// Source line (WARN, TRACE).
    pub line: u32,
    /// Module path (WARN).
    pub module: &'a str,
    /// `YYYY-MM-DD HH:MM:SS` (WARN).
    pub timestamp: &'a str,
    /// Milliseconds since the logger started (TRACE).
    pub elapsed_ms: f64,
    /// The message.
    pub msg: &'a str,
}

/// Formats one line exactly as NCCL does, newline included.
pub fn format_line(p: &LineParts<'_>) -> String {
    let LineParts { host, pid, tid, dev, file, line, msg, .. } = *p;
    match p.kind {
        LineKind::Info => format!("{host}:{pid}:{tid} [{dev}] NCCL INFO {msg}\n"),
        LineKind::Warn => {
            format!("\n[{}] {host}:{pid}:{tid} [{dev}] {file}:{line} ({}) NCCL WARN {msg}\n", p.timestamp, p.module)
        }
        LineKind::Trace => format!("{host}:{pid}:{tid} [{dev}] {:.6} {file}:{line} NCCL TRACE {msg}\n", p.elapsed_ms),
    }
}

/// Expands `NCCL_DEBUG_FILE` as NCCL does: `%h` host name, `%p` pid, `%%` a percent sign;
/// any other `%x` is kept as written.
pub fn expand_debug_file_name(template: &str, host: &str, pid: u32) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    let mut chars = template.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('%') => out.push('%'),
            Some('h') => out.push_str(host),
            Some('p') => out.push_str(&pid.to_string()),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// The host name up to its first `.`, as NCCL prints it.
pub fn short_host_name(name: &str) -> &str {
    name.split('.').next().unwrap_or(name)
}

thread_local! {
    static DEVICE: Cell<i32> = const { Cell::new(0) };
    static TID: i64 = current_tid();
}

/// Sets the CUDA device shown in this thread's log lines (default 0).
pub fn set_thread_device(dev: i32) {
    DEVICE.with(|d| d.set(dev));
}

/// The CUDA device shown in this thread's log lines.
pub fn thread_device() -> i32 {
    DEVICE.try_with(Cell::get).unwrap_or(0)
}

fn thread_id() -> i64 {
    TID.try_with(|t| *t).unwrap_or_else(|_| current_tid())
}

#[cfg(target_os = "linux")]
fn current_tid() -> i64 {
    // SAFETY: gettid takes no arguments, has no preconditions and cannot fail.
    i64::from(unsafe { libc::gettid() })
}

#[cfg(not(target_os = "linux"))]
fn current_tid() -> i64 {
    i64::from(std::process::id())
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: `buf` is valid for writes of `buf.len()` bytes for the whole call, and
    // gethostname writes at most that many.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return "unknown".to_owned();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    let name = String::from_utf8_lossy(&buf[..end]);
    short_host_name(&name).to_owned()
}

/// `YYYY-MM-DD HH:MM:SS` in local time (NCCL's `%F %T`), UTC if the time zone is unknown.
fn local_timestamp(now: SystemTime) -> String {
    let secs = match now.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_secs()).unwrap_or(i64::MAX),
    };
    // time_t is 64-bit on every target ferroccl supports; saturate anywhere else.
    let t = libc::time_t::try_from(secs).unwrap_or(libc::time_t::MAX);
    let mut tm = libc::tm {
        tm_sec: 0,
        tm_min: 0,
        tm_hour: 0,
        tm_mday: 0,
        tm_mon: 0,
        tm_year: 0,
        tm_wday: 0,
        tm_yday: 0,
        tm_isdst: 0,
        tm_gmtoff: 0,
        tm_zone: std::ptr::null(),
    };
    // SAFETY: both pointers refer to live, properly aligned locals for the whole call;
    // localtime_r is reentrant and writes only `tm`.
    let result = unsafe { libc::localtime_r(&raw const t, &raw mut tm) };
    if result.is_null() {
        return utc_timestamp(secs);
    }
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02}",
        i64::from(tm.tm_year) + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// `YYYY-MM-DD HH:MM:SS` in UTC for seconds since the Unix epoch.
fn utc_timestamp(secs: i64) -> String {
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

static LAST_WARNING: Mutex<Option<String>> = Mutex::new(None);

/// The text of the most recent WARN (or ERROR) record in this process, as NCCL's
/// `ncclGetLastError` reports it; kept even when `NCCL_DEBUG` is unset.
pub fn last_warning() -> Option<String> {
    lock(&LAST_WARNING).clone()
}

fn remember_warning(msg: &str) {
    *lock(&LAST_WARNING) = Some(msg.to_owned());
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

enum Sink {
    Stdout,
    File(File),
    #[cfg(test)]
    Buffer(Vec<u8>),
}

impl Sink {
    /// One write of the whole line, then a flush. Errors are dropped: logging must not fail.
    fn write_line(&mut self, line: &str) {
        match self {
            Self::Stdout => {
                let mut out = io::stdout().lock();
                let _ = out.write_all(line.as_bytes());
                let _ = out.flush();
            }
            Self::File(f) => {
                let _ = f.write_all(line.as_bytes());
                let _ = f.flush();
            }
            #[cfg(test)]
            Self::Buffer(b) => b.extend_from_slice(line.as_bytes()),
        }
    }
}

struct NcclLogger {
    config: DebugConfig,
    host: String,
    pid: u32,
    epoch: Instant,
    sink: Mutex<Sink>,
    /// Why `NCCL_DEBUG_FILE` could not be opened (the logger then uses stdout).
    open_error: Option<String>,
}

impl NcclLogger {
    fn new(config: DebugConfig) -> Self {
        let host = host_name();
        let pid = std::process::id();
        let mut open_error = None;
        let sink = match &config.file {
            None => Sink::Stdout,
            Some(template) => {
                let path = expand_debug_file_name(template, &host, pid);
                // NCCL opens with "w": truncate, one file per process via %p.
                match File::create(&path) {
                    Ok(f) => Sink::File(f),
                    Err(e) => {
                        open_error = Some(format!("Cannot open NCCL_DEBUG_FILE {path}: {e}; logging to stdout"));
                        Sink::Stdout
                    }
                }
            }
        };
        Self::with_sink(config, sink, host, pid, open_error)
    }

    fn with_sink(config: DebugConfig, sink: Sink, host: String, pid: u32, open_error: Option<String>) -> Self {
        Self { config, host, pid, epoch: Instant::now(), sink: Mutex::new(sink), open_error }
    }

    fn emit(&self, kind: LineKind, record: Option<&Record<'_>>, msg: &str) {
        let timestamp = match kind {
            LineKind::Warn => local_timestamp(SystemTime::now()),
            LineKind::Info | LineKind::Trace => String::new(),
        };
        let line = format_line(&LineParts {
            kind,
            host: &self.host,
            pid: self.pid,
            tid: thread_id(),
            dev: thread_device(),
            file: record.and_then(Record::file).unwrap_or("?"),
            line: record.and_then(Record::line).unwrap_or(0),
            module: record.and_then(Record::module_path).unwrap_or("?"),
            timestamp: &timestamp,
            elapsed_ms: self.epoch.elapsed().as_secs_f64() * 1000.0,
            msg,
        });
        lock(&self.sink).write_line(&line);
    }

    fn banner(&self, text: &str) {
        if self.config.prints_banner() {
            self.emit(LineKind::Info, None, text);
        }
    }
}

impl Log for NcclLogger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        let kind = LineKind::of(metadata.level());
        kind == LineKind::Warn || self.config.prints(kind, subsys_flags(metadata.target()))
    }

    fn log(&self, record: &Record<'_>) {
        let kind = LineKind::of(record.level());
        let prints = self.config.prints(kind, subsys_flags(record.target()));
        if kind != LineKind::Warn && !prints {
            return;
        }
        let msg = record.args().to_string();
        if kind == LineKind::Warn {
            remember_warning(&msg);
        }
        if prints {
            self.emit(kind, Some(record), &msg);
        }
    }

    fn flush(&self) {}
}

static LOGGER: OnceLock<NcclLogger> = OnceLock::new();
static INSTALLED: AtomicBool = AtomicBool::new(false);

fn logger() -> &'static NcclLogger {
    LOGGER.get_or_init(|| NcclLogger::new(DebugConfig::from_snapshot(crate::env::snapshot())))
}

/// Installs the NCCL logger (once; later calls return at once) and sets `log`'s max level
/// from `NCCL_DEBUG`. If the host program already installed a logger, that one stays and
/// receives our records (then [`last_warning`] stays empty). Afterwards logs, at INFO, the
/// environment's invalid-value messages (target ALL) and `... set by environment to ...`
/// lines (target ENV).
pub fn init() {
    static INIT: Once = Once::new();
    INIT.call_once(|| {
        let logger = logger();
        if log::set_logger(logger).is_ok() {
            log::set_max_level(logger.config.level.max_level());
            INSTALLED.store(true, Ordering::Release);
        }
        if let Some(e) = &logger.open_error {
            log::info!(target: "ALL", "{e}");
        }
        for w in crate::env::warnings() {
            log::info!(target: "ALL", "{w}");
        }
        for line in crate::env::env_log_lines() {
            log::info!(target: "ENV", "{line}");
        }
    });
}

/// Whether [`init`] installed our logger (false if another logger was there first).
pub fn is_installed() -> bool {
    INSTALLED.load(Ordering::Acquire)
}

/// The process's `NCCL_DEBUG` level.
/// Wall-clock microseconds (modulo 1000 s) for TRACE lines: one clock for every process of
/// the host, so that ranks' timelines can be lined up.
pub fn wall_us() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros() % 1_000_000_000)
}

pub fn debug_level() -> DebugLevel {
    logger().config.level
}

/// Prints `<host>:<pid>:<tid> [<dev>] NCCL INFO <text>` once per process when `NCCL_DEBUG`
/// is VERSION, WARN, INFO or TRACE (as NCCL's `showVersion`), e.g.
/// `version_banner("NCCL version 2.27.7+ferroccl-0.1.0")`. Calls [`init`] first.
pub fn version_banner(text: &str) {
    static SHOWN: Once = Once::new();
    init();
    SHOWN.call_once(|| logger().banner(text));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(level: DebugLevel, mask: &str) -> DebugConfig {
        DebugConfig { level, mask: SubsysMask::parse(mask), file: None }
    }

    fn parts(kind: LineKind, msg: &str) -> LineParts<'_> {
        LineParts {
            kind,
            host: "node1",
            pid: 4242,
            tid: 4250,
            dev: 3,
            file: "src/transport/socket.rs",
            line: 77,
            module: "ferroccl::transport::socket",
            timestamp: "2024-02-29 12:34:56",
            elapsed_ms: 12.5,
            msg,
        }
    }

    #[test]
    fn level_parsing() {
        assert_eq!(DebugLevel::parse(None), DebugLevel::Off);
        assert_eq!(DebugLevel::parse(Some("VERSION")), DebugLevel::Version);
        assert_eq!(DebugLevel::parse(Some("warn")), DebugLevel::Warn);
        assert_eq!(DebugLevel::parse(Some("Abort")), DebugLevel::Warn);
        assert_eq!(DebugLevel::parse(Some("info")), DebugLevel::Info);
        assert_eq!(DebugLevel::parse(Some("TRACE")), DebugLevel::Trace);
        assert_eq!(DebugLevel::parse(Some("verbose")), DebugLevel::Off);
        assert_eq!(DebugLevel::Off.max_level(), LevelFilter::Warn);
        assert_eq!(DebugLevel::Version.max_level(), LevelFilter::Warn);
        assert_eq!(DebugLevel::Info.max_level(), LevelFilter::Info);
        assert_eq!(DebugLevel::Trace.max_level(), LevelFilter::Trace);
    }

    #[test]
    fn subsys_lists() {
        let f = subsys_flags;
        let m = SubsysMask::parse("INIT,NET");
        assert!(m.allows(f("INIT")) && m.allows(f("NET")));
        assert!(!m.allows(f("COLL")) && !m.allows(f("ENV")));
        let m = SubsysMask::parse("^NET");
        assert!(!m.allows(f("NET")));
        assert!(m.allows(f("INIT")) && m.allows(f("COLL")) && m.allows(f("DESTROY")));
        let m = SubsysMask::parse("^NET,coll");
        assert!(!m.allows(f("NET")) && !m.allows(f("COLL")) && m.allows(f("P2P")));
        let m = SubsysMask::parse("ALL");
        assert!(SUBSYSTEMS.iter().all(|&(_, flag)| m.allows(flag)));
        assert_eq!(SubsysMask::parse("^ALL"), SubsysMask(0));
        assert_eq!(SubsysMask::parse(""), SubsysMask(0));
        assert_eq!(SubsysMask::parse("init, bogus ,Bootstrap,ENV"), SubsysMask::DEFAULT);
        assert_eq!(SubsysMask::parse("INIT,BOOTSTRAP,ENV"), SubsysMask::DEFAULT);
    }

    #[test]
    fn targets() {
        assert_eq!(subsys_flags("NET"), 0x10);
        assert_eq!(subsys_flags("BOOTSTRAP"), 0x1000);
        assert_eq!(subsys_flags("ALL"), ALL_SUBSYSTEMS);
        assert_eq!(subsys_flags("ferroccl::bootstrap::tcp"), subsys_flags("INIT"));
        assert_eq!(subsys_target(0x10), "NET");
        assert_eq!(subsys_target(0x80 | 0x1000), "ENV");
        assert_eq!(subsys_target(0), "ALL");
    }

    #[test]
    fn what_prints() {
        let c = config(DebugLevel::Warn, "INIT");
        assert!(c.prints(LineKind::Warn, subsys_flags("NET")));
        assert!(!c.prints(LineKind::Info, subsys_flags("INIT")));
        let c = config(DebugLevel::Warn, "");
        assert!(c.prints(LineKind::Warn, subsys_flags("NET")));
        let c = config(DebugLevel::Info, "INIT,BOOTSTRAP,ENV");
        assert!(c.prints(LineKind::Info, subsys_flags("BOOTSTRAP")));
        assert!(c.prints(LineKind::Info, subsys_flags("ALL")));
        assert!(!c.prints(LineKind::Info, subsys_flags("NET")));
        assert!(!c.prints(LineKind::Trace, subsys_flags("INIT")));
        let c = config(DebugLevel::Trace, "^NET");
        assert!(c.prints(LineKind::Trace, subsys_flags("COLL")));
        assert!(!c.prints(LineKind::Trace, subsys_flags("NET")));
        for level in [DebugLevel::Off, DebugLevel::Version] {
            let c = config(level, "ALL");
            assert!(!c.prints(LineKind::Warn, ALL_SUBSYSTEMS));
            assert!(!c.prints(LineKind::Info, ALL_SUBSYSTEMS));
        }
    }

    #[test]
    fn banner_levels() {
        assert!(!config(DebugLevel::Off, "ALL").prints_banner());
        assert!(config(DebugLevel::Version, "").prints_banner());
        assert!(config(DebugLevel::Warn, "").prints_banner());
        assert!(config(DebugLevel::Info, "NET").prints_banner());
        assert!(config(DebugLevel::Trace, "INIT").prints_banner());
        assert!(!config(DebugLevel::Info, "").prints_banner());
    }

    #[test]
    fn config_from_environment() {
        let s = Snapshot::from_lookup(|_| None, &[]);
        assert_eq!(
            DebugConfig::from_snapshot(&s),
            DebugConfig { level: DebugLevel::Off, mask: SubsysMask::DEFAULT, file: None }
        );
        let s = Snapshot::from_lookup(
            |name| match name {
                "NCCL_DEBUG" => Some("info".into()),
                "NCCL_DEBUG_SUBSYS" => Some("^NET".into()),
                _ => None,
            },
            &["NCCL_DEBUG_FILE=/tmp/nccl.%h.%p.log\n"],
        );
        assert_eq!(
            DebugConfig::from_snapshot(&s),
            DebugConfig { level: DebugLevel::Info, mask: SubsysMask(!0x10), file: Some("/tmp/nccl.%h.%p.log".into()) }
        );
    }

    #[test]
    fn debug_file_names() {
        let x = |t| expand_debug_file_name(t, "node1", 4242);
        assert_eq!(x("/tmp/nccl.%h.%p.log"), "/tmp/nccl.node1.4242.log");
        assert_eq!(x("/tmp/plain.log"), "/tmp/plain.log");
        assert_eq!(x("100%%-%p"), "100%-4242");
        assert_eq!(x("a%xb"), "a%xb");
        assert_eq!(x("end%"), "end%");
        assert_eq!(x("%h%h"), "node1node1");
    }

    #[test]
    fn host_names() {
        assert_eq!(short_host_name("node1.cluster.example.com"), "node1");
        assert_eq!(short_host_name("node1"), "node1");
        let h = host_name();
        assert!(!h.is_empty() && !h.contains('.'));
    }

    #[test]
    fn info_line() {
        assert_eq!(
            format_line(&parts(LineKind::Info, "Bootstrap: Using eth0:10.0.0.1<0>")),
            "node1:4242:4250 [3] NCCL INFO Bootstrap: Using eth0:10.0.0.1<0>\n"
        );
    }

    #[test]
    fn warn_line() {
        assert_eq!(
            format_line(&parts(LineKind::Warn, "message truncated")),
            "\n[2024-02-29 12:34:56] node1:4242:4250 [3] src/transport/socket.rs:77 \
             (ferroccl::transport::socket) NCCL WARN message truncated\n"
        );
    }

    #[test]
    fn trace_line() {
        assert_eq!(
            format_line(&parts(LineKind::Trace, "isend 4096")),
            "node1:4242:4250 [3] 12.500000 src/transport/socket.rs:77 NCCL TRACE isend 4096\n"
        );
    }

    #[test]
    fn timestamps() {
        assert_eq!(utc_timestamp(0), "1970-01-01 00:00:00");
        assert_eq!(utc_timestamp(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(utc_timestamp(1_234_567_890), "2009-02-13 23:31:30");
        assert_eq!(utc_timestamp(1_709_210_096), "2024-02-29 12:34:56");
        assert_eq!(utc_timestamp(4_102_444_799), "2099-12-31 23:59:59");
        assert_eq!(utc_timestamp(-1), "1969-12-31 23:59:59");
        let local = local_timestamp(SystemTime::now());
        assert_eq!(local.len(), "YYYY-MM-DD HH:MM:SS".len(), "{local}");
    }

    #[test]
    fn thread_devices() {
        assert_eq!(thread_device(), 0);
        set_thread_device(5);
        assert_eq!(thread_device(), 5);
        std::thread::spawn(|| assert_eq!(thread_device(), 0)).join().unwrap();
        assert!(thread_id() > 0);
    }

    /// Serializes the tests that read [`last_warning`], which is process-global.
    static LAST_WARNING_TESTS: Mutex<()> = Mutex::new(());

    fn buffer_logger(level: DebugLevel, mask: &str) -> NcclLogger {
        let sink = Sink::Buffer(Vec::new());
        NcclLogger::with_sink(config(level, mask), sink, "node1".into(), 7, None)
    }

    fn output(logger: &NcclLogger) -> String {
        match &*lock(&logger.sink) {
            Sink::Buffer(b) => String::from_utf8(b.clone()).unwrap(),
            _ => unreachable!("test logger writes to a buffer"),
        }
    }

    /// Logs one record through `logger`; `format_args!` must live inside one expression.
    macro_rules! log_to {
        ($logger:expr, $level:expr, $target:expr, $($arg:tt)+) => {
            $logger.log(
                &Record::builder()
                    .args(format_args!($($arg)+))
                    .level($level)
                    .target($target)
                    .file(Some("src/x.rs"))
                    .line(Some(9))
                    .module_path(Some("ferroccl::x"))
                    .build(),
            )
        };
    }

    #[test]
    fn logger_filters_and_formats() {
        let _serial = lock(&LAST_WARNING_TESTS);
        let l = buffer_logger(DebugLevel::Info, "INIT,BOOTSTRAP,ENV");
        let tid = thread_id();
        log_to!(l, Level::Info, "NET", "hidden {}", 1);
        log_to!(l, Level::Info, "ferroccl::comm", "shown {}", 2);
        log_to!(l, Level::Info, "ENV", "NCCL_IB_DISABLE set by environment to 1.");
        log_to!(l, Level::Debug, "INIT", "too detailed");
        assert_eq!(
            output(&l),
            format!(
                "node1:7:{tid} [0] NCCL INFO shown 2\n\
                 node1:7:{tid} [0] NCCL INFO NCCL_IB_DISABLE set by environment to 1.\n"
            )
        );
        log_to!(l, Level::Warn, "NET", "peer {} closed", 3);
        let out = output(&l);
        let warn = out.rsplit_once("\n\n[").unwrap().1;
        assert!(
            warn.ends_with(&format!("] node1:7:{tid} [0] src/x.rs:9 (ferroccl::x) NCCL WARN peer 3 closed\n")),
            "{out:?}"
        );
        assert_eq!(last_warning().as_deref(), Some("peer 3 closed"));
    }

    #[test]
    fn warnings_kept_when_silent() {
        let _serial = lock(&LAST_WARNING_TESTS);
        let l = buffer_logger(DebugLevel::Off, "ALL");
        assert!(l.enabled(&Metadata::builder().level(Level::Warn).build()));
        assert!(!l.enabled(&Metadata::builder().level(Level::Info).build()));
        log_to!(l, Level::Error, "INIT", "silent failure {}", 9);
        log_to!(l, Level::Info, "INIT", "not recorded");
        assert_eq!(output(&l), "");
        assert_eq!(last_warning().as_deref(), Some("silent failure 9"));
        l.banner("NCCL version x");
        assert_eq!(output(&l), "");
    }

    #[test]
    fn banner_line() {
        let _serial = lock(&LAST_WARNING_TESTS);
        let l = buffer_logger(DebugLevel::Version, "");
        log_to!(l, Level::Warn, "INIT", "not at VERSION");
        l.banner("NCCL version 2.27.7+ferroccl-0.1.0");
        assert_eq!(output(&l), format!("node1:7:{} [0] NCCL INFO NCCL version 2.27.7+ferroccl-0.1.0\n", thread_id()));
    }
}

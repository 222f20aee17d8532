//! `cargo run -p gen-header -- <out.h>`: writes ferroccl's C header with the pinned cbindgen.
//! `make header` and `make check-header` call this; the result is committed as include/nccl.h.

use std::path::PathBuf;
use std::process::ExitCode;

/// Prints cbindgen's errors (otherwise they would vanish silently).
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Error
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            eprintln!("gen-header: {}: {}", r.level(), r.args());
        }
    }
    fn flush(&self) {}
}

static LOGGER: StderrLog = StderrLog;

fn main() -> ExitCode {
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(log::LevelFilter::Error);
    let out = match std::env::args().nth(1) {
        Some(path) => PathBuf::from(path),
        None => {
            eprintln!("usage: gen-header <output.h>");
            return ExitCode::from(2);
        }
    };
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let config = match cbindgen::Config::from_file(crate_dir.join("cbindgen.toml")) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("gen-header: cbindgen.toml: {e}");
            return ExitCode::FAILURE;
        }
    };
    match cbindgen::Builder::new().with_crate(&crate_dir).with_config(config).generate() {
        Ok(bindings) => {
            bindings.write_to_file(&out);
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gen-header: {e}");
            ExitCode::FAILURE
        }
    }
}

//! The encryption canary and `--psk-env` end to end: the built benchmark, 2 ranks (threads, or
//! processes under mpirun), sockets on loopback only.

use std::process::{Command, Output};

// The benchmark's own JSON module (serde_json), to read what the canary writes.
#[cfg(feature = "tls")]
#[allow(dead_code)]
#[path = "../src/json.rs"]
mod json;

const BENCH: &str = env!("CARGO_BIN_EXE_ferroccl-bench");

/// The canary on 1 MiB, as quick as it gets (ranks as threads).
const CANARY_1M: &[&str] = &["all_reduce", "-t", "2", "--canary", "-b", "1M", "-e", "1M", "-n", "3", "-w", "1"];

/// `program` with a clean environment for encryption: sockets on loopback only.
fn command(program: &str) -> Command {
    let mut cmd = Command::new(program);
    cmd.env("NCCL_SHM_DISABLE", "1")
        .env("NCCL_SOCKET_IFNAME", "lo")
        .env_remove("FERROCCL_ENCRYPTION_POLICY")
        .env_remove("FERROCCL_BENCH_CANARY_PSK");
    cmd
}

fn bench(args: &[&str]) -> Command {
    let mut cmd = command(BENCH);
    cmd.args(args);
    cmd
}

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Runs `cmd`, expecting exit status `code` and no benchmark at all; its stderr.
fn refused(mut cmd: Command, code: i32) -> String {
    let out = cmd.output().unwrap();
    let (stdout, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(code), "{cmd:?}\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(!stdout.contains("Collective test starting"), "ran anyway: {stdout}");
    stderr
}

/// The canary itself (a build with TLS).
#[cfg(feature = "tls")]
mod with_tls {
    use std::path::PathBuf;
    use std::process::Command;

    use super::json::Json;
    use super::{bench, command, text, BENCH, CANARY_1M};

    /// The number after `label` on the summary line starting with `prefix`.
    fn summary_number(stdout: &str, prefix: &str, label: &str) -> f64 {
        let line = stdout.lines().find(|l| l.starts_with(prefix)).unwrap_or_else(|| panic!("no '{prefix}' line"));
        let rest = &line[line.find(label).unwrap_or_else(|| panic!("no '{label}' in '{line}'")) + label.len()..];
        let word = rest.split_whitespace().next().unwrap_or("");
        word.parse().unwrap_or_else(|_| panic!("'{word}' after '{label}' in '{line}' is not a number"))
    }

    fn scratch_file(name: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}-{}.json", std::process::id()))
    }

    /// Runs a canary that must pass (`--max-loss 100`); its stdout and its -J document.
    fn passing_canary(mut cmd: Command, name: &str) -> (String, Json) {
        let json_path = scratch_file(name);
        cmd.args(["--max-loss", "100", "-J", json_path.to_str().unwrap()]);
        let out = cmd.output().unwrap();
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(0), "{cmd:?}\nstdout:\n{stdout}\nstderr:\n{stderr}");
        let doc = super::json::parse(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
        let _ = std::fs::remove_file(&json_path);
        (stdout, doc)
    }

    /// What every passing 1 MiB canary on 2 ranks shows: both phases with numbers, and
    /// reports that prove the encrypted phase used TLS and the plaintext one did not.
    fn assert_canary_output(stdout: &str, doc: &Json, rounds: usize) {
        // Both phases ran their ordinary table, then the summary.
        for phase in ["# Encryption canary: plaintext phase", "# Encryption canary: encrypted phase"] {
            assert!(stdout.contains(phase), "{stdout}");
        }
        assert_eq!(stdout.matches("# Out of bounds values : 0 OK").count(), 2 * rounds, "{stdout}");
        assert!(stdout.contains("# Encryption canary: all_reduce float 1048576 B, 2 ranks"), "{stdout}");
        for phase in ["#   plaintext :", "#   encrypted :"] {
            assert!(summary_number(stdout, phase, "busbw") > 0.0, "{stdout}");
            assert!(summary_number(stdout, phase, "p99") > 0.0, "{stdout}");
        }
        assert!(stdout.contains("(TLS1.3/TLS_AES_128_GCM_SHA256, "), "{stdout}");
        let loss = summary_number(stdout, "#   loss      :", ":");
        assert!(loss.is_finite() && loss <= 100.0, "{stdout}");
        assert!(stdout.contains("(max allowed 100 %) -> PASS"), "{stdout}");
        assert!(!stdout.contains("WARNING"), "sockets only, yet: {stdout}");

        assert_eq!(doc.get("verdict").and_then(Json::as_str), Some("PASS"));
        assert_eq!(doc.get("max_loss_percent").and_then(Json::as_f64), Some(100.0));
        let json_loss = doc.get("loss_percent").and_then(Json::as_f64).unwrap();
        assert!((json_loss - loss).abs() <= 0.051, "{json_loss} printed as {loss}");
        let coverage = |phase: &str| doc.get("encryption").and_then(|e| e.get(phase)).unwrap().clone();
        let (plain, enc) = (coverage("plaintext"), coverage("encrypted"));
        assert!(enc.get("tls_data_connections").and_then(Json::as_i64).unwrap() > 0);
        assert_eq!(enc.get("plaintext_connections").and_then(Json::as_i64), Some(0));
        assert_eq!(plain.get("tls_connections").and_then(Json::as_i64), Some(0));

        // The library's own reports, one per rank, carried through unchanged.
        let phases = doc.get("phases").unwrap();
        for (phase, encrypted) in [("plaintext", false), ("encrypted", true)] {
            let reports = phases.get(phase).and_then(|p| p.get("encryption_reports")).and_then(Json::as_array).unwrap();
            assert_eq!(reports.len(), 2, "{phase}");
            for report in reports {
                let expected = if encrypted { "psk" } else { "none" };
                assert_eq!(report.get("encryption").and_then(Json::as_str), Some(expected), "{phase}");
                let net = report.get("net").unwrap();
                assert!(net.get("count").and_then(Json::as_i64).unwrap() > 0, "{phase}: no socket data connection");
                for security in net.get("security").and_then(Json::as_array).unwrap() {
                    assert_eq!(security.get("encrypted").and_then(Json::as_bool), Some(encrypted), "{phase}");
                }
            }
        }
    }

    #[test]
    fn canary_with_ranks_as_threads() {
        let (stdout, doc) = passing_canary(bench(CANARY_1M), "canary-threads");
        assert_canary_output(&stdout, &doc, 1);
        assert!(stdout.contains("# Mode: threads (1 process x 2 threads, 2 ranks)"), "{stdout}");
    }

    /// Several rounds alternate the phases; the verdict compares per-phase medians.
    #[test]
    fn canary_rounds_alternate_the_phases() {
        let args: Vec<&str> = CANARY_1M.iter().copied().chain(["--canary-rounds", "2"]).collect();
        let (stdout, doc) = passing_canary(bench(&args), "canary-rounds");
        assert_canary_output(&stdout, &doc, 2);
        assert_eq!(stdout.matches("# Encryption canary: plaintext phase").count(), 2, "{stdout}");
        assert_eq!(stdout.matches("# Encryption canary: encrypted phase").count(), 2, "{stdout}");
        assert!(stdout.contains("#   rounds    : 2 (loss per round, %: "), "{stdout}");
        assert_eq!(doc.get("rounds").and_then(Json::as_i64), Some(2));
        let losses = doc.get("loss_percent_per_round").and_then(Json::as_array).expect("per-round losses");
        assert_eq!(losses.len(), 2);
    }

    /// One process per rank: each runs its phases, relaying their MPI calls.
    #[test]
    #[cfg(feature = "mpi")]
    fn canary_under_mpirun() {
        if Command::new("mpirun").arg("--version").output().is_err() {
            println!("skipped: no mpirun");
            return;
        }
        let mut cmd = command("timeout");
        cmd.args(["300", "mpirun", "-np", "2", BENCH])
            .args(["all_reduce", "--canary", "-b", "1M", "-e", "1M", "-n", "3", "-w", "1"])
            .env("OMPI_MCA_rmaps_base_oversubscribe", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        let (stdout, doc) = passing_canary(cmd, "canary-mpi");
        assert_canary_output(&stdout, &doc, 1);
        assert_eq!(stdout.matches("# Mode: mpi (2 processes x 1 thread, 2 ranks)").count(), 2, "{stdout}");
    }

    #[test]
    fn psk_env_encrypts_an_ordinary_run() {
        let args =
            ["all_reduce", "-t", "2", "-b", "64K", "-e", "64K", "-n", "2", "-w", "1", "--psk-env", "BENCH_TEST_KEY"];
        let out = bench(&args)
            .env("BENCH_TEST_KEY", "k".repeat(40))
            .env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "INIT")
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert_eq!(out.status.code(), Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
        assert!(stdout.contains("# Encryption: TLS 1.3 with a pre-shared key"), "{stdout}");
        assert!(stdout.contains("# Out of bounds values : 0 OK"), "{stdout}");
        // The library's own account of each rank's connections (logged at teardown).
        let all = format!("{stdout}{stderr}");
        let coverage: Vec<&str> = all.lines().filter(|l| l.contains("Encryption coverage: comm")).collect();
        assert!(coverage.len() >= 2, "{all}");
        for line in coverage {
            assert!(line.contains("NET/Socket") && line.contains("TLS1.3") && line.contains("plaintext 0"), "{line}");
        }
    }
}

#[test]
fn a_short_key_is_refused_before_anything_runs() {
    for canary in [true, false] {
        let mut args = vec!["all_reduce", "-t", "2", "-b", "1K", "-e", "1K", "--psk-env", "BENCH_TEST_SHORT_KEY"];
        if canary {
            args.push("--canary");
        }
        let mut cmd = bench(&args);
        cmd.env("BENCH_TEST_SHORT_KEY", "only-twenty-bytes-ok");
        let stderr = refused(cmd, 2);
        let expected = "--psk-env BENCH_TEST_SHORT_KEY: the pre-shared key has 20 bytes; at least 32 are required";
        assert!(stderr.contains(expected), "{stderr}");
    }
}

#[test]
fn a_missing_key_variable_is_refused() {
    let mut cmd = bench(&["all_reduce", "--psk-env", "BENCH_TEST_UNSET_KEY"]);
    cmd.env_remove("BENCH_TEST_UNSET_KEY");
    let stderr = refused(cmd, 2);
    assert!(stderr.contains("--psk-env BENCH_TEST_UNSET_KEY: the variable is not set"), "{stderr}");
}

#[test]
fn the_canary_refuses_bad_settings() {
    for (args, message) in [
        (&["--max-loss=-3"][..], "--max-loss must be a percentage >= 0"),
        (&["-N", "0"], "--canary needs a finite run"),
        (&["-b", "0", "-e", "0"], "the largest size (-e) must be above 0"),
    ] {
        let mut cmd = bench(&["all_reduce", "-t", "2", "--canary"]);
        cmd.args(args);
        let stderr = refused(cmd, 2);
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
    // --max-loss only means something with --canary (a usage error, from clap).
    refused(bench(&["all_reduce", "--max-loss", "5"]), 2);
}

#[test]
#[cfg(not(feature = "tls"))]
fn without_tls_the_canary_and_psk_env_say_how_to_build() {
    // The canary with its generated key, and an ordinary run with a key.
    for args in [CANARY_1M, &["all_reduce", "-t", "2", "-b", "1K", "-e", "1K", "--psk-env", "BENCH_TEST_KEY"]] {
        let mut cmd = bench(args);
        cmd.env("BENCH_TEST_KEY", "k".repeat(40));
        let stderr = refused(cmd, 2);
        assert!(stderr.contains("built without TLS support: rebuild it with --features tls"), "{stderr}");
    }
}

//! `DEPFLOW_EXECUTOR` and `DEPFLOW_THREADS`, read by the builder's defaults.
//!
//! Environment variables are the process's: each case runs this test binary
//! again as a child with the variables set, whose `probe` test reports what
//! the builder made of them.

use std::process::Command;

use depflow::{BoxError, Engine};

/// What an engine's default device is: `inline`, or `pool(N)`.
fn describe(engine: &Engine) -> String {
    let me = std::thread::current().id();
    let v = engine.new_var();
    let op = engine
        .push(&[], &[&v], |_| {
            Ok::<_, BoxError>(std::thread::current().id())
        })
        .unwrap();
    // An inline device runs the op inside `push`, on this thread.
    let inline = op.is_finished();
    let ran_here = op.wait().unwrap() == me;
    if inline && ran_here {
        return "inline".into();
    }
    let debug = format!("{engine:?}");
    let threads: String = debug
        .split("threads: ")
        .nth(1)
        .expect("a pool's Debug shows its threads")
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    format!("pool({threads})")
}

/// Run as a child by `env_switches`: reports on stdout.
#[test]
fn probe() {
    if std::env::var_os("DEPFLOW_ENV_PROBE").is_none() {
        return; // run as a test of its own: nothing to probe
    }
    let default = match Engine::builder().build() {
        Ok(engine) => describe(&engine),
        Err(e) => format!("error: {e}"),
    };
    // (On a line of its own: libtest's "test probe ... " has no newline.)
    println!("\nDEFAULT={default}");
    let threads = Engine::builder().threads(1).build().map(|e| describe(&e));
    println!(
        "THREADS1={}",
        threads.unwrap_or_else(|e| format!("error: {e}"))
    );
    let inline = Engine::builder()
        .executor(depflow::Executor::inline())
        .build()
        .map(|e| describe(&e));
    println!(
        "INLINE={}",
        inline.unwrap_or_else(|e| format!("error: {e}"))
    );
    let new = std::panic::catch_unwind(|| describe(&Engine::new()));
    let new = new.unwrap_or_else(|payload| {
        let msg = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("panic: {msg}")
    });
    println!("NEW={new}");
}

/// The probe's report with `vars` set (and no other `DEPFLOW_*` variable).
fn probe_with(vars: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut child = Command::new(std::env::current_exe().unwrap());
    child
        .args(["--exact", "probe", "--nocapture", "--test-threads=1"])
        .env("DEPFLOW_ENV_PROBE", "1")
        .env_remove("DEPFLOW_EXECUTOR")
        .env_remove("DEPFLOW_THREADS");
    for (k, v) in vars {
        child.env(k, v);
    }
    let out = child.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "probe failed: {stdout}");
    stdout
        .lines()
        .filter_map(|l| l.split_once('='))
        .filter(|(k, _)| ["DEFAULT", "THREADS1", "INLINE", "NEW"].contains(k))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn get<'a>(report: &'a [(String, String)], key: &str) -> &'a str {
    &report
        .iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no {key} in {report:?}"))
        .1
}

#[test]
fn env_switches() {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);

    // Unset: a pool with one thread per core.
    let r = probe_with(&[]);
    assert_eq!(get(&r, "DEFAULT"), format!("pool({cores})"));
    assert_eq!(get(&r, "NEW"), format!("pool({cores})"));

    // The debugging switch: every op inline.
    let r = probe_with(&[("DEPFLOW_EXECUTOR", "inline")]);
    assert_eq!(get(&r, "DEFAULT"), "inline");
    assert_eq!(get(&r, "NEW"), "inline");
    // An explicit call overrides it.
    assert_eq!(get(&r, "THREADS1"), "pool(1)");

    // The pool's size, alone or with `pool`.
    let r = probe_with(&[("DEPFLOW_THREADS", "3")]);
    assert_eq!(get(&r, "DEFAULT"), "pool(3)");
    let r = probe_with(&[("DEPFLOW_EXECUTOR", "pool"), ("DEPFLOW_THREADS", "2")]);
    assert_eq!(get(&r, "DEFAULT"), "pool(2)");
    assert_eq!(get(&r, "INLINE"), "inline");

    // Empty counts as unset.
    let r = probe_with(&[("DEPFLOW_EXECUTOR", ""), ("DEPFLOW_THREADS", "")]);
    assert_eq!(get(&r, "DEFAULT"), format!("pool({cores})"));

    // Bad values: a configuration error naming the variable, and a panic
    // with that message from `Engine::new`; an explicit executor still wins.
    for (var, value) in [
        ("DEPFLOW_EXECUTOR", "naive"),
        ("DEPFLOW_THREADS", "0"),
        ("DEPFLOW_THREADS", "many"),
    ] {
        let r = probe_with(&[(var, value)]);
        let default = get(&r, "DEFAULT");
        assert!(
            default.starts_with("error: invalid engine configuration")
                && default.contains(var)
                && default.contains(value),
            "{var}={value}: {default}"
        );
        let new = get(&r, "NEW");
        assert!(
            new.starts_with("panic: depflow: cannot start the engine") && new.contains(var),
            "{var}={value}: {new}"
        );
        assert_eq!(get(&r, "THREADS1"), "pool(1)");
    }
}

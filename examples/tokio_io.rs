//! Async file I/O on a tokio runtime while a CPU pool computes.
//!
//! The engine has two devices: the default one, a pool of CPU threads, and
//! `io`, whose ops run as tasks on this program's tokio runtime
//! (`Executor::tokio`), so they can await `tokio::fs`. Each of the shards
//! goes through three ops, pushed at once as a plain serial program:
//!
//! 1. `load` (on `io`): reads the shard's input file into a variable;
//! 2. `digest` (on the pool): a CPU-heavy pass over those bytes;
//! 3. `save` (on `io`): writes the digest to the shard's output file.
//!
//! The engine orders each shard's three ops by their variables and overlaps
//! the shards: files are read and written while the pool computes. `main`
//! never blocks a thread: it `.await`s, racing the end of the work against a
//! progress ticker and a deadline in `tokio::select!`.
//!
//! ```text
//! cargo run --example tokio_io --features tokio
//! ```

use std::path::PathBuf;
use std::time::Duration;

use depflow::{BoxError, Engine, Executor};

const SHARDS: usize = 8;
const SHARD_BYTES: usize = 1 << 16;
const ROUNDS: u64 = 16;

/// The CPU-heavy part: a few rounds of FNV-1a over the bytes.
fn digest(bytes: &[u8]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for round in 0..ROUNDS {
        for &b in bytes {
            h = (h ^ u64::from(b) ^ round).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Shard `i`'s input bytes.
fn shard(i: usize) -> Vec<u8> {
    (0..SHARD_BYTES).map(|j| (i * 31 + j * 7) as u8).collect()
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let engine = Engine::builder()
        .threads(2)
        .device("io", Executor::tokio(tokio::runtime::Handle::current()))
        .build()?;
    let io = engine.device("io").expect("defined above");

    let dir = std::env::temp_dir().join(format!("depflow-tokio-io-{}", std::process::id()));
    tokio::fs::create_dir_all(&dir).await?;
    let input = |i: usize| dir.join(format!("in-{i}.bin"));
    let output = |i: usize| dir.join(format!("out-{i}.txt"));
    for i in 0..SHARDS {
        tokio::fs::write(input(i), shard(i)).await?;
    }

    let mut saves = Vec::new();
    for i in 0..SHARDS {
        let raw = engine.var(Vec::<u8>::new());
        let sum = engine.var(0u64);
        let (raw_k, sum_k) = (raw.key(), sum.key());

        let path: PathBuf = input(i);
        engine
            .op()
            .name("load")
            .on(io)
            .mutates(&[&raw])
            .run_async(move |ctx| async move {
                let bytes = tokio::fs::read(&path).await?;
                *ctx.write(raw_k)? = bytes;
                Ok::<_, BoxError>(())
            })?;

        engine
            .op()
            .name("digest")
            .reads(&[&raw])
            .mutates(&[&sum])
            .run(move |ctx| -> Result<(), BoxError> {
                let d = digest(&ctx.read(raw_k)?);
                *ctx.write(sum_k)? = d;
                Ok(())
            })?;

        let path = output(i);
        let save =
            engine
                .op()
                .name("save")
                .on(io)
                .reads(&[&sum])
                .run_async(move |ctx| async move {
                    let line = format!("{:016x}\n", *ctx.read(sum_k)?);
                    tokio::fs::write(&path, line).await?;
                    Ok::<_, BoxError>(path)
                })?;
        saves.push(save);
    }

    // Await the first save, then all the work, showing progress meanwhile
    // and giving up after a deadline.
    let mut first = saves.remove(0);
    let mut all = engine.wait_all();
    let tick = Duration::from_millis(25);
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + tick, tick);
    let deadline = tokio::time::sleep(Duration::from_secs(30));
    tokio::pin!(deadline);
    let mut first_done = false;
    loop {
        tokio::select! {
            path = &mut first, if !first_done => {
                first_done = true;
                println!("first output written: {}", path?.display());
            }
            done = &mut all, if first_done => {
                done?;
                break;
            }
            _ = ticker.tick() => {
                println!("{} op(s) in flight", engine.diagnostics().in_flight());
            }
            () = &mut deadline => return Err("the work took more than 30 s".into()),
        }
    }

    // Every output is on disk, and right.
    for i in 0..SHARDS {
        let want = digest(&shard(i));
        let got = tokio::fs::read_to_string(output(i)).await?;
        assert_eq!(got.trim(), format!("{want:016x}"), "shard {i}");
    }
    for save in saves {
        save.await?; // finished already: resolves at once
    }
    println!("{SHARDS} shards loaded, digested and saved");
    tokio::fs::remove_dir_all(&dir).await?;
    Ok(())
}

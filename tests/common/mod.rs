//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod held;
pub mod parallel;
pub mod streams;
#[cfg(feature = "tokio")]
pub mod tokio_io;
pub mod traced;
pub mod units;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use depflow::{Engine, Executor};

/// Runs `f` on another thread and fails the test if it takes longer than
/// `secs`: a hang becomes a failure, not a stuck CI job.
pub fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(t) => t,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("did not finish within {secs} s (hang?)")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            panic!("panicked (its message is above)")
        }
    }
}

/// splitmix64, the workloads' generator.
#[derive(Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let z = self.0;
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(z)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// splitmix64's output function: a well-mixed hash of `z` (the
/// differential tests' values are made of it).
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Counts how many of its clones were dropped.
#[derive(Clone, Default)]
pub struct DropCount(pub Arc<AtomicUsize>);

pub struct Token(Arc<AtomicUsize>);

impl DropCount {
    pub fn token(&self) -> Token {
        Token(self.0.clone())
    }

    pub fn dropped(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Drop for Token {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// Every executor configuration the engine offers, by name.
pub fn engines() -> Vec<(&'static str, Engine)> {
    vec![
        ("pool1", Engine::builder().threads(1).build().unwrap()),
        ("pool2", Engine::builder().threads(2).build().unwrap()),
        ("pool4", Engine::builder().threads(4).build().unwrap()),
        (
            "inline",
            Engine::builder()
                .executor(Executor::inline())
                .build()
                .unwrap(),
        ),
        ("custom", custom_engine()),
        (
            "devices",
            Engine::builder()
                .threads(1)
                .device("d1", Executor::pool(2))
                .device("d2", Executor::pool(1))
                .build()
                .unwrap(),
        ),
    ]
}

/// An engine whose ops run on a plain thread pool of the test's own, through
/// `Executor::custom`.
pub fn custom_engine() -> Engine {
    Engine::builder().executor(custom_pool(2)).build().unwrap()
}

/// An `Executor::custom` handing jobs to a plain pool of `threads` threads
/// of the test's own (they stop once the engine drops the executor).
pub fn custom_pool(threads: usize) -> Executor {
    let (tx, rx) = crossbeam_like_channel();
    for _ in 0..threads {
        let rx = rx.clone();
        std::thread::spawn(move || {
            loop {
                let job = rx.lock().unwrap().recv();
                match job {
                    Ok(job) => {
                        job.run();
                    }
                    Err(_) => break, // the engine dropped its executor
                }
            }
        });
    }
    Executor::custom(move |job| {
        let _ = tx.lock().unwrap().send(job);
    })
}

type Chan = (
    Arc<std::sync::Mutex<std::sync::mpsc::Sender<depflow::Job>>>,
    Arc<std::sync::Mutex<std::sync::mpsc::Receiver<depflow::Job>>>,
);

fn crossbeam_like_channel() -> Chan {
    let (tx, rx) = std::sync::mpsc::channel();
    (
        Arc::new(std::sync::Mutex::new(tx)),
        Arc::new(std::sync::Mutex::new(rx)),
    )
}

/// "Device memory" for tests on a simulated GPU: a cell the enqueued work
/// updates.
pub type Mem = Arc<std::sync::atomic::AtomicU64>;

/// An engine with `host_threads` host workers and a simulated GPU named
/// "gpu" of two compute lanes, and that device.
pub fn gpu_engine(host_threads: usize) -> (Engine, depflow::Device) {
    let engine = Engine::builder()
        .threads(host_threads)
        .device("gpu", Executor::simulated_gpu(2))
        .build()
        .unwrap();
    let gpu = engine.device("gpu").unwrap();
    (engine, gpu)
}

/// A gate (device) work blocks on until the test opens it.
#[derive(Clone)]
pub struct Gate(Arc<std::sync::Mutex<std::sync::mpsc::Receiver<()>>>);

impl Gate {
    /// Blocks until the gate's sender sends once.
    pub fn pass(&self) {
        self.0.lock().unwrap().recv().unwrap();
    }
}

/// A gate and its sender, which opens it once per send.
pub fn gate() -> (std::sync::mpsc::Sender<()>, Gate) {
    let (tx, rx) = std::sync::mpsc::channel();
    (tx, Gate(Arc::new(std::sync::Mutex::new(rx))))
}

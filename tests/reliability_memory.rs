//! Issue 35, planned memory: a buffer whose size overflows, and an arena
//! that cannot be allocated, are errors, never a panic or an abort.

use depflow::{Engine, Error, write};

/// A recording with a buffer whose bytes overflow `usize` fails with an
/// error naming the buffer (it used to panic inside `Engine::record`).
#[test]
fn a_buffer_whose_size_overflows_fails_the_recording() {
    let engine = Engine::builder().threads(1).build().unwrap();
    let err = engine
        .record(|rec| {
            let huge = rec.buffer::<u64>(usize::MAX / 2);
            rec.op().with(write(&huge)).run(|h: &mut [u64]| {
                h[0] = 1;
                Ok(())
            })
        })
        .unwrap_err();
    match err {
        Error::Graph(m) => assert!(m.contains("more than one allocation may hold"), "{m}"),
        e => panic!("expected Error::Graph, got {e:?}"),
    }
}

/// A planned arena larger than the address space records fine; its first
/// replay fails the op that touches it with an error (it used to abort the
/// process: "memory allocation of ... bytes failed"), and so does the next.
#[test]
fn an_arena_that_cannot_be_allocated_fails_the_replay() {
    let engine = Engine::builder().threads(1).build().unwrap();
    let graph = engine
        .record(|rec| {
            // 256 TiB: past any x86-64 or AArch64 user address space.
            let huge = rec.buffer::<u8>(1 << 48);
            rec.op()
                .name("fill")
                .with(write(&huge))
                .run(|h: &mut [u8]| {
                    h[0] = 1;
                    Ok(())
                })
        })
        .unwrap();
    for _ in 0..2 {
        let err = graph.replay().wait().unwrap_err();
        let text = format!("{err}: {:?}", std::error::Error::source(&err));
        assert!(
            text.contains("could not be allocated"),
            "expected the allocation failure, got {text}"
        );
    }
}

/// A standalone buffer (`Engine::buffer`) too large to allocate: the op
/// that touches it fails with an error.
#[test]
fn a_standalone_buffer_too_large_fails_its_op() {
    let engine = Engine::builder().threads(1).build().unwrap();
    for huge in [
        engine.buffer::<u64>(usize::MAX / 2),
        engine.buffer::<u64>(1 << 45),
    ] {
        let err = engine
            .op()
            .with(write(&huge))
            .run(|h: &mut [u64]| {
                h[0] = 1;
                Ok(())
            })
            .unwrap()
            .wait()
            .unwrap_err();
        let text = format!("{err}: {:?}", std::error::Error::source(&err));
        assert!(text.contains("could not be allocated"), "{text}");
    }
}

/// The same for a device arena on the simulated GPU: its first replay fails
/// with an error instead of aborting the process.
#[test]
fn a_device_arena_that_cannot_be_allocated_fails_the_replay() {
    use depflow::Executor;
    let engine = Engine::builder()
        .device("gpu", Executor::simulated_gpu(1))
        .build()
        .unwrap();
    let gpu = engine.device("gpu").unwrap();
    let graph = engine
        .record(|rec| {
            // 256 TiB: past any x86-64 or AArch64 user address space.
            let huge = rec.device_buffer::<u8>(gpu, 1 << 48)?;
            let h = huge.clone();
            rec.op().on(gpu).mutates(&[&huge]).run(move |ctx| {
                let _ = ctx.device_buffer_mut(&h)?;
                Ok::<(), depflow::BoxError>(())
            })
        })
        .unwrap();
    let err = graph.replay().wait().unwrap_err();
    let text = format!("{err}: {:?}", std::error::Error::source(&err));
    assert!(text.contains("could not be allocated"), "{text}");
}

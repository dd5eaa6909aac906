//! The shim's loom side: loom's cell, waker slot and `thread_local!`. Only
//! the models in `loom-tests/` run code built this way; the engine's own
//! threads (pools, pollers, simulated streams) are never started there.

pub(crate) mod cell {
    pub(crate) use loom::cell::UnsafeCell;
}

pub(crate) mod future {
    /// A waker slot that one side registers in and the other wakes.
    #[derive(Debug, Default)]
    pub(crate) struct AtomicWaker(loom::future::AtomicWaker);

    impl AtomicWaker {
        pub(crate) fn register(&self, waker: &std::task::Waker) {
            self.0.register_by_ref(waker);
        }

        pub(crate) fn wake(&self) {
            self.0.wake();
        }
    }
}

pub(crate) mod thread {
    /// `loom::thread_local!`, taking the `const` initializer std's takes.
    macro_rules! local_key {
        ($(#[$attr:meta])* static $name:ident: $t:ty = const $init:block;) => {
            loom::thread_local! { $(#[$attr])* static $name: $t = $init; }
        };
    }
    pub(crate) use local_key as thread_local;
}

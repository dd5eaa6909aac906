//! The shim under `cfg(loom)`: loom's primitives, with non-poisoning locks.
//! Only the models in `loom-tests/` run code built this way; the engine's
//! own threads (pools, pollers, simulated streams) are never started there.

pub(crate) mod sync {
    pub(crate) use loom::sync::atomic;
    pub(crate) use loom::sync::{MutexGuard, WaitTimeoutResult};

    /// `loom::sync::Mutex` whose `lock` ignores poisoning.
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }
    }

    /// `loom::sync::Condvar` whose waits ignore poisoning.
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(loom::sync::Condvar);

    impl Condvar {
        pub(crate) fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
            self.0
                .wait(guard)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }

        pub(crate) fn wait_timeout<'a, T>(
            &self,
            guard: MutexGuard<'a, T>,
            timeout: std::time::Duration,
        ) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
            self.0
                .wait_timeout(guard, timeout)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }

        pub(crate) fn notify_one(&self) {
            self.0.notify_one();
        }

        pub(crate) fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

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

//! The shim in normal builds: std, with non-poisoning locks and loom's
//! closure-based `UnsafeCell` API compiled down to a plain cell.

pub(crate) mod sync {
    pub(crate) use std::sync::atomic;
    pub(crate) use std::sync::{MutexGuard, WaitTimeoutResult};

    /// `std::sync::Mutex` whose `lock` ignores poisoning.
    #[derive(Debug, Default)]
    pub(crate) struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) const fn new(value: T) -> Self {
            Self(std::sync::Mutex::new(value))
        }
    }

    impl<T: ?Sized> Mutex<T> {
        #[inline]
        pub(crate) fn lock(&self) -> MutexGuard<'_, T> {
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }
    }

    /// `std::sync::Condvar` whose waits ignore poisoning.
    #[derive(Debug, Default)]
    pub(crate) struct Condvar(std::sync::Condvar);

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
    /// `UnsafeCell` with loom's closure-based API, so that loom can check
    /// every access for causality; here it compiles to a plain cell.
    #[derive(Debug, Default)]
    #[repr(transparent)]
    pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

    impl<T> UnsafeCell<T> {
        pub(crate) const fn new(value: T) -> Self {
            Self(std::cell::UnsafeCell::new(value))
        }

        /// Runs `f` with a pointer to the contents; the caller's `unsafe`
        /// block must justify reading through it.
        #[inline(always)]
        pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
            f(self.0.get())
        }

        /// Runs `f` with a mutable pointer to the contents; the caller's
        /// `unsafe` block must justify writing through it.
        #[inline(always)]
        pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
            f(self.0.get())
        }
    }
}

pub(crate) mod future {
    /// A waker slot that one side registers in and the other wakes.
    #[derive(Debug, Default)]
    pub(crate) struct AtomicWaker(futures::task::AtomicWaker);

    impl AtomicWaker {
        pub(crate) fn register(&self, waker: &std::task::Waker) {
            self.0.register(waker);
        }

        pub(crate) fn wake(&self) {
            self.0.wake();
        }
    }
}

pub(crate) mod thread {
    /// `std::thread_local!` with a `const` initializer (loom's takes none).
    macro_rules! local_key {
        ($(#[$attr:meta])* static $name:ident: $t:ty = const $init:block;) => {
            std::thread_local! { $(#[$attr])* static $name: $t = const $init; }
        };
    }
    pub(crate) use local_key as thread_local;
}

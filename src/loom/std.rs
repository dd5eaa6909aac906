//! The shim's std side: loom's closure-based `UnsafeCell` API compiled down
//! to a plain cell, a waker slot, and `thread_local!`.

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

//! Planned buffers: intermediates of a recorded graph whose memory the
//! graph plans ([`Buffer`]), and the arena they live in; and an engine's
//! buffers outside any graph, each in an arena of its own, planned for it
//! alone (`Buffer::standalone`).
//!
//! A buffer is a variable (for declarations, ordering and poison) plus a
//! slot in its graph's [`Arena`]: at the end of the recording the graph
//! gives every slot an offset, so that buffers never live at once may
//! share bytes (see `crate::graph::plan`). The arena's memory is taken the
//! first time a replay touches a buffer, zeroed, and kept for the next
//! replays; if it cannot be allocated, that access fails with an error (the
//! op fails, and the next access tries again), never an abort. A buffer's bytes are the previous owner's leftovers until its
//! first writer writes them (the graph refuses a recording that reads a
//! buffer before writing it).
//!
//! Access goes through the op's context ([`OpCtx::read`],
//! [`OpCtx::write`], as for a variable: see `operand`) with the same checks
//! and borrow counting as a variable's value. The element types are those for which every bit
//! pattern is a value ([`Element`]), so leftover bytes are never undefined
//! behaviour, only stale numbers.
//!
//! | field | written by | read by |
//! | --- | --- | --- |
//! | `Arena::offsets` | the recording's end (once) | ops of replays |
//! | `Arena::memory` | the first access of the first replay (once, under `Arena::allocating`) | ops of replays |
//! | the arena's bytes | ops holding a buffer mutably, in its planned range | ops holding it |

// `unsafe`: slices of the arena, under the graph's ordering; each block says
// why it is sound.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex, OnceLock};

use super::ctx::{OpCtx, Operand, TypedVar, VarMut, VarRef, operand_sealed};
use super::var::{AnyVar, Var, VarCore, VarHold, VarKey, sealed};
use crate::error::{Error, VarId};

/// A type whose values a [`Buffer`] may hold: plain numbers, for which any
/// bytes are a value. Sealed.
pub trait Element: Copy + Send + Sync + 'static + private::Sealed {}

mod private {
    pub trait Sealed {}
}

macro_rules! elements {
    ($($t:ty),*) => {$(
        impl private::Sealed for $t {}
        impl Element for $t {}
    )*};
}
elements!(
    u8, u16, u32, u64, u128, usize, i8, i16, i32, i64, i128, isize, f32, f64
);

/// The arena's unit: 64-byte aligned, so that every [`Element`] is aligned
/// at offsets the plan aligns.
#[repr(C, align(64))]
struct Line(UnsafeCell<[u8; 64]>);

/// The memory a graph's buffers share.
#[derive(Default)]
pub(crate) struct Arena {
    /// Each buffer's offset in bytes, and the arena's size: set once, at
    /// the recording's end.
    plan: OnceLock<(Box<[usize]>, usize)>,
    memory: OnceLock<Box<[Line]>>,
    /// Held while allocating `memory`, so that ops touching the arena at
    /// once allocate it once (an allocation that fails sets nothing: the
    /// next access tries again).
    allocating: Mutex<()>,
}

// SAFETY: the bytes are reached only through `OpCtx::read_buffer`/`write_buffer`,
// under the graph's ordering: a buffer's range is borrowed mutably only by
// the one op holding it mutably, and two buffers' ranges overlap only if no
// two ops using them can run at once (the plan).
unsafe impl Sync for Arena {}
// SAFETY: as above; the memory is owned.
unsafe impl Send for Arena {}

impl std::fmt::Debug for Arena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arena")
            .field("bytes", &self.plan.get().map(|p| p.1))
            .field("allocated", &self.memory.get().is_some())
            .finish()
    }
}

impl Arena {
    /// Sets the plan: buffer `i` starts `offsets[i]` bytes into an arena of
    /// `bytes` bytes. Once.
    pub(crate) fn set_plan(&self, offsets: Box<[usize]>, bytes: usize) {
        assert!(self.plan.set((offsets, bytes)).is_ok(), "planned twice");
    }

    /// Whether the arena's memory has been taken (by a replay).
    pub(crate) fn is_allocated(&self) -> bool {
        self.memory.get().is_some()
    }

    /// The start of buffer `slot`, taking the memory on first use.
    fn start(&self, slot: u32) -> Result<*mut u8, Error> {
        let (offsets, bytes) = self
            .plan
            .get()
            .ok_or_else(|| Error::Graph("a buffer used before its recording ended".into()))?;
        let memory = match self.memory.get() {
            Some(memory) => memory,
            None => self.allocate(*bytes)?,
        };
        let base: *mut u8 =
            UnsafeCell::raw_get(memory.as_ptr().cast::<UnsafeCell<[u8; 64]>>()).cast();
        // SAFETY: the plan keeps every buffer's range inside the arena.
        Ok(unsafe { base.add(offsets[slot as usize]) })
    }

    /// Takes the arena's `bytes` of zeroed memory, or says why it cannot:
    /// a failed allocation is an error of the access, never an abort.
    #[cold]
    fn allocate(&self, bytes: usize) -> Result<&[Line], Error> {
        let _only = self.allocating.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(memory) = self.memory.get() {
            return Ok(memory);
        }
        let lines = bytes.div_ceil(64);
        let mut memory: Vec<Line> = Vec::new();
        memory.try_reserve_exact(lines).map_err(|_| {
            Error::Graph(format!(
                "the planned buffers' memory ({bytes} bytes) could not be allocated"
            ))
        })?;
        memory.resize_with(lines, || Line(UnsafeCell::new([0; 64])));
        Ok(self.memory.get_or_init(|| memory.into_boxed_slice()))
    }
}

/// The bytes of `len` values of `T`, or `None` past what one allocation
/// may hold (`isize::MAX` bytes).
pub(crate) fn buffer_bytes<T: Element>(len: usize) -> Option<usize> {
    len.checked_mul(size_of::<T>())
        .filter(|&b| b <= isize::MAX as usize)
}

/// `len` values of `T` that ops declare like a variable and whose bodies
/// reach them as `[T]` ([`OpCtx::read`], [`OpCtx::write`], and typed
/// access: [`read`](crate::read), [`write`](crate::write)). Made by a
/// recording ([`Recorder::buffer`](crate::Recorder::buffer)), it is an
/// intermediate of the graph whose memory the graph plans; made by an
/// engine ([`Engine::buffer`](crate::Engine::buffer)), it has memory of its
/// own, zeroed.
///
/// Clones refer to the same buffer.
pub struct Buffer<T: Element> {
    var: Var<()>,
    arena: Arc<Arena>,
    slot: u32,
    len: usize,
    _values: PhantomData<fn() -> T>,
}

impl<T: Element> Clone for Buffer<T> {
    fn clone(&self) -> Self {
        Self {
            var: self.var.clone(),
            arena: self.arena.clone(),
            slot: self.slot,
            len: self.len,
            _values: PhantomData,
        }
    }
}

impl<T: Element> std::fmt::Debug for Buffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Buffer")
            .field("id", &self.var.id())
            .field("len", &self.len)
            .finish()
    }
}

impl<T: Element> Buffer<T> {
    /// Buffer number `slot` of the graph whose arena is `arena`, made with
    /// its variable.
    pub(crate) fn new(var: Var<()>, arena: Arc<Arena>, slot: u32, len: usize) -> Self {
        Self {
            var,
            arena,
            slot,
            len,
            _values: PhantomData,
        }
    }

    /// A buffer outside any graph, on variable `var`: an arena of its own,
    /// planned for this one buffer.
    /// A length whose bytes overflow gets an arena that cannot be
    /// allocated: its first access fails with an error.
    pub(crate) fn standalone(var: Var<()>, len: usize) -> Self {
        let bytes = buffer_bytes::<T>(len).unwrap_or(usize::MAX);
        let arena = Arena::default();
        arena.set_plan(Box::new([0]), bytes);
        Self::new(var, Arc::new(arena), 0, len)
    }

    /// The buffer's identity (its variable's).
    pub fn id(&self) -> VarId {
        self.var.id()
    }

    /// How many values it holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no value.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn key(&self) -> VarKey<()> {
        self.var.key()
    }
}

impl<T: Element> sealed::Sealed for Buffer<T> {}

impl<T: Element> AnyVar for Buffer<T> {
    #[inline]
    fn core(&self) -> &VarCore {
        self.var.core()
    }

    #[inline]
    fn hold(&self) -> VarHold {
        self.var.hold()
    }

    fn to_owned_var(&self) -> Box<dyn AnyVar> {
        Box::new(self.clone())
    }
}

impl OpCtx {
    /// Borrows the values of a planned buffer the op declared (read or
    /// mutated): the same as [`read`](Self::read), which takes buffers too.
    ///
    /// # Errors
    ///
    /// As for [`read`](Self::read).
    #[deprecated(since = "0.1.0", note = "`OpCtx::read` takes planned buffers too")]
    pub fn buffer<T: Element>(&self, buffer: &Buffer<T>) -> Result<VarRef<'_, [T]>, Error> {
        self.read_buffer(buffer)
    }

    /// Mutably borrows the values of a planned buffer the op declared as
    /// mutated: the same as [`write`](Self::write), which takes buffers
    /// too.
    ///
    /// # Errors
    ///
    /// As for [`write`](Self::write).
    #[deprecated(since = "0.1.0", note = "`OpCtx::write` takes planned buffers too")]
    pub fn buffer_mut<T: Element>(&self, buffer: &Buffer<T>) -> Result<VarMut<'_, [T]>, Error> {
        self.write_buffer(buffer)
    }

    /// [`read`](Self::read) of a planned buffer: a slice of its arena.
    pub(super) fn read_buffer<T: Element>(
        &self,
        buffer: &Buffer<T>,
    ) -> Result<VarRef<'_, [T]>, Error> {
        let key = buffer.key();
        let (i, edge) = self.find(key)?;
        let count = if edge.is_write() {
            let count = self.borrow_counter(i);
            count
                .fetch_update(
                    std::sync::atomic::Ordering::Acquire,
                    std::sync::atomic::Ordering::Relaxed,
                    |c| (c != super::ctx::MUT).then_some(c + 1),
                )
                .map_err(|_| Error::Borrowed(key.id()))?;
            Some(count)
        } else {
            None
        };
        let start = match buffer.arena.start(buffer.slot) {
            Ok(start) => start,
            Err(e) => {
                if let Some(c) = count {
                    c.fetch_sub(1, std::sync::atomic::Ordering::Release);
                }
                return Err(e);
            }
        };
        // SAFETY: the plan gives the buffer `len` values' worth of bytes at
        // `start`, aligned for `T`, inside the arena; any bytes are a `T`
        // (`Element`). The op holds the buffer (declared, granted by the
        // graph's order), and the borrow count excludes a live mutable
        // borrow from this body; no op that may run meanwhile uses an
        // overlapping range (the plan).
        let value = unsafe { std::slice::from_raw_parts(start.cast::<T>(), buffer.len) };
        Ok(VarRef { value, count })
    }

    /// [`write`](Self::write) of a planned buffer: a slice of its arena.
    pub(super) fn write_buffer<T: Element>(
        &self,
        buffer: &Buffer<T>,
    ) -> Result<VarMut<'_, [T]>, Error> {
        let key = buffer.key();
        let (_, count, _) = self.claim(key)?;
        let start = match buffer.arena.start(buffer.slot) {
            Ok(start) => start,
            Err(e) => {
                count.store(0, std::sync::atomic::Ordering::Release);
                return Err(e);
            }
        };
        // SAFETY: as in `read_buffer`; the op holds the buffer mutably, and
        // the borrow count makes this the body's only borrow of it.
        let value = unsafe { std::slice::from_raw_parts_mut(start.cast::<T>(), buffer.len) };
        Ok(VarMut { value, count })
    }
}

impl<T: Element> operand_sealed::Sealed for Buffer<T> {}

impl<T: Element> Operand for Buffer<T> {
    type Value = [T];

    #[inline]
    fn read_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarRef<'c, [T]>, Error> {
        ctx.read_buffer(self)
    }

    #[inline]
    fn write_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarMut<'c, [T]>, Error> {
        ctx.write_buffer(self)
    }
}

impl<T: Element> TypedVar for Buffer<T> {
    type Key = Buffer<T>;

    #[inline]
    fn typed_key(&self) -> Buffer<T> {
        self.clone()
    }
}

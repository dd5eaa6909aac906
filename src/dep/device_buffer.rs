//! Planned device buffers: intermediates of a recorded graph that live in
//! a stream device's memory ([`DeviceBuffer`]), and the one arena per
//! device per graph they share ([`DeviceArena`]).
//!
//! The host half is `buffer`; this is its device half, planned the same
//! way (at the recording's end each buffer gets an offset in its device's
//! arena, shared with buffers never live at once: `crate::graph::plan`)
//! but held as device memory (`crate::device::DeviceMemory`):
//!
//! - **taken lazily**: the first op of a replay that asks for a buffer
//!   ([`OpCtx::device_buffer`], in its body, on the device's launcher)
//!   allocates the whole arena on its lane, ordered before every lane's
//!   later work; the next replays reuse it;
//! - **given back in stream order**: when the graph's runtime goes (the
//!   graph dropped and no replay left in flight: a replay holds the
//!   runtime until all its device work is done), [`DeviceArenas`] releases
//!   each arena, which enqueues the free behind every lane's work so far.
//!
//! Only ops on the buffer's device may declare it (the recording refuses
//! others), and a body reaches it as a [`DeviceSlice`] at its offset: what
//! device work captures. A buffer's bytes are the previous owner's leftovers
//! until its first writer writes them, as for host buffers.
//!
//! | field | written by | read by |
//! | --- | --- | --- |
//! | `DeviceArena::plan` | the recording's end (once) | ops of replays |
//! | `DeviceArena::memory` | the first access of the first replay (taken); the runtime's drop (released) | ops of replays, under its lock |
//! | the device memory | device work of ops holding a buffer mutably, in its planned range | device work of ops holding it |

// `unsafe`: views of the device arena, under the plan; each block says why
// it is sound.
#![allow(unsafe_code)]

use std::marker::PhantomData;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};

use super::buffer::Element;
use super::ctx::OpCtx;
use super::var::{AnyVar, Var, VarCore, VarHold, VarKey, sealed};
use crate::device::{DeviceMemory, DeviceSlice, Stream};
use crate::error::{Error, VarId};
use crate::loom::sync::Mutex;

/// Where an arena's memory is in its life.
enum Memory {
    /// Not taken yet: no replay reached a buffer.
    Untaken,
    Taken(DeviceMemory),
    /// Given back: the graph is gone.
    Released,
}

/// The device memory one graph's buffers on one device share.
pub(crate) struct DeviceArena {
    device: u16,
    /// Each buffer's offset in bytes, and the arena's size: set once, at
    /// the recording's end.
    plan: OnceLock<(Box<[usize]>, usize)>,
    memory: Mutex<Memory>,
    allocations: AtomicUsize,
    frees: Arc<AtomicUsize>,
}

impl std::fmt::Debug for DeviceArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceArena")
            .field("device", &self.device)
            .field("bytes", &self.plan.get().map(|p| p.1))
            .field("allocated", &self.is_allocated())
            .finish()
    }
}

impl DeviceArena {
    /// The arena of device `device` (an index of the engine's).
    pub(crate) fn new(device: u16) -> Self {
        Self {
            device,
            plan: OnceLock::new(),
            memory: Mutex::new(Memory::Untaken),
            allocations: AtomicUsize::new(0),
            frees: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Its device's index.
    pub(crate) fn device(&self) -> u16 {
        self.device
    }

    /// Sets the plan: buffer `i` starts `offsets[i]` bytes into an arena of
    /// `bytes` bytes. Once.
    pub(crate) fn set_plan(&self, offsets: Box<[usize]>, bytes: usize) {
        assert!(self.plan.set((offsets, bytes)).is_ok(), "planned twice");
    }

    /// Whether its memory is taken (by a replay) and not given back.
    pub(crate) fn is_allocated(&self) -> bool {
        matches!(*self.memory.lock(), Memory::Taken(_))
    }

    /// Gives its memory back (in stream order, see the module docs): once
    /// no replay can run. Later accesses fail.
    pub(crate) fn release(&self) {
        let memory = std::mem::replace(&mut *self.memory.lock(), Memory::Released);
        drop(memory);
    }

    /// A slice of `len` values of `T` at buffer `slot`'s offset, for an op
    /// whose stream is `stream`, taking the memory on first use.
    fn slice<T: Element>(
        &self,
        stream: &Stream,
        slot: u32,
        len: usize,
        writable: bool,
    ) -> Result<DeviceSlice<T>, Error> {
        let (offsets, bytes) = self.plan.get().ok_or_else(|| {
            Error::Graph("a device buffer used before its recording ended".into())
        })?;
        let mut memory = self.memory.lock();
        if let Memory::Untaken = *memory {
            let taken = DeviceMemory::alloc(stream, *bytes, self.frees.clone())
                .map_err(|m| Error::Stream(format!("allocating a graph's device memory: {m}")))?;
            self.allocations.fetch_add(1, SeqCst);
            *memory = Memory::Taken(taken);
        }
        match &*memory {
            // SAFETY: `T` is an `Element` (any bytes are a value); the plan
            // aligns the buffer's offset for `T` (at most 64) and keeps its
            // `len` values inside the arena's `bytes`.
            Memory::Taken(m) => Ok(unsafe { m.slice(offsets[slot as usize], len, writable) }),
            Memory::Released => Err(Error::Graph(
                "a device buffer used after its graph was dropped".into(),
            )),
            Memory::Untaken => unreachable!("taken above"),
        }
    }
}

/// A graph's device arenas, owned by its runtime: given back when it goes
/// (no replay can run any more, and every replay's device work is done).
#[derive(Debug, Default)]
pub(crate) struct DeviceArenas(pub(crate) Vec<Arc<DeviceArena>>);

impl Drop for DeviceArenas {
    fn drop(&mut self) {
        for arena in &self.0 {
            arena.release();
        }
    }
}

/// An intermediate of a recorded graph held in a stream device's memory:
/// `len` values of `T`, from
/// [`Recorder::device_buffer`](crate::Recorder::device_buffer). Declare it
/// like a variable, in ops on its device only; reach it with
/// [`OpCtx::device_buffer`] and [`OpCtx::device_buffer_mut`].
///
/// Clones refer to the same buffer.
pub struct DeviceBuffer<T: Element> {
    var: Var<()>,
    arena: Arc<DeviceArena>,
    slot: u32,
    len: usize,
    _values: PhantomData<fn() -> T>,
}

impl<T: Element> Clone for DeviceBuffer<T> {
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

impl<T: Element> std::fmt::Debug for DeviceBuffer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceBuffer")
            .field("id", &self.var.id())
            .field("device", &self.arena.device)
            .field("len", &self.len)
            .finish()
    }
}

impl<T: Element> DeviceBuffer<T> {
    /// Buffer number `slot` of the arena `arena`, made with its variable.
    pub(crate) fn new(var: Var<()>, arena: Arc<DeviceArena>, slot: u32, len: usize) -> Self {
        Self {
            var,
            arena,
            slot,
            len,
            _values: PhantomData,
        }
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

    /// The index of its device in the engine.
    pub fn device_index(&self) -> usize {
        usize::from(self.arena.device)
    }

    /// Tests: how many times its graph took its device's arena, and how
    /// many times it gave it back (counted once the free has run on the
    /// device).
    #[doc(hidden)]
    pub fn arena_events(&self) -> (usize, usize) {
        (
            self.arena.allocations.load(SeqCst),
            self.arena.frees.load(SeqCst),
        )
    }

    fn key(&self) -> VarKey<()> {
        self.var.key()
    }
}

impl<T: Element> sealed::Sealed for DeviceBuffer<T> {}

impl<T: Element> AnyVar for DeviceBuffer<T> {
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

impl<T: Element> DeviceSlice<T> {
    /// The same bytes as values of `U` (a kernel that reads a buffer of
    /// `u8` as `u32`, say).
    ///
    /// # Errors
    ///
    /// [`Error::Graph`] if the slice's offset is not aligned for `U` or its
    /// bytes are not a whole number of `U`s.
    pub fn cast<U: Element>(&self) -> Result<DeviceSlice<U>, Error> {
        let bytes = self.len() * size_of::<T>();
        let (tn, un) = (std::any::type_name::<T>(), std::any::type_name::<U>());
        if self.offset() % align_of::<U>() != 0 {
            return Err(Error::Graph(format!(
                "a device slice of {tn} at offset {} cannot be viewed as {un}: not aligned to \
                 {} bytes",
                self.offset(),
                align_of::<U>()
            )));
        }
        if bytes % size_of::<U>() != 0 {
            return Err(Error::Graph(format!(
                "a device slice of {} {tn} ({bytes} bytes) cannot be viewed as {un}: not a whole \
                 number of {}-byte values",
                self.len(),
                size_of::<U>()
            )));
        }
        // SAFETY: `U` is an `Element`; its alignment (at most 16) divides
        // the offset, and the same bytes hold `bytes / size_of::<U>()` of it.
        Ok(unsafe { self.recast(bytes / size_of::<U>()) })
    }
}

impl OpCtx {
    /// A read-only view of a planned device buffer the op declared (read
    /// or mutated), for the op's device work to capture: only in an op of
    /// the buffer's graph on its device. The first call of the graph's
    /// first replay takes the device's arena.
    ///
    /// ```
    /// use depflow::{Engine, Executor};
    /// use std::sync::{Arc, atomic::{AtomicU32, Ordering::SeqCst}};
    ///
    /// let engine = Engine::builder().device("gpu", Executor::simulated_gpu(1)).build()?;
    /// let gpu = engine.device("gpu").unwrap();
    /// let out = engine.var(Arc::new(AtomicU32::new(0)));
    /// let graph = engine.record(|rec| {
    ///     let tmp = rec.device_buffer::<u32>(gpu, 4)?; // in the GPU's memory
    ///     rec.op().on(gpu).mutates(&[&tmp]).run({
    ///         let tmp = tmp.clone();
    ///         move |ctx| {
    ///             let tmp = ctx.device_buffer_mut(&tmp)?; // what a kernel gets
    ///             Ok(ctx.stream()?.simulate(move || tmp.with_mut(|x| x.fill(3)))?)
    ///         }
    ///     })?;
    ///     rec.op().on(gpu).reads(&[&tmp]).mutates(&[&out]).run({
    ///         let (tmp, out) = (tmp.clone(), out.key());
    ///         move |ctx| {
    ///             let (tmp, out) = (ctx.device_buffer(&tmp)?, ctx.write(out)?.clone());
    ///             Ok(ctx.stream()?.simulate(move || {
    ///                 tmp.with(|x| out.store(x.iter().sum(), SeqCst))
    ///             })?)
    ///         }
    ///     })
    /// })?;
    /// assert_eq!(graph.device_plan(gpu).unwrap().arena_bytes, 16);
    /// assert!(!graph.is_device_allocated(gpu)); // taken by the first replay
    /// graph.replay().wait()?;
    /// assert_eq!(engine.get(&out).wait()?.load(SeqCst), 12);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NotDeclared`] if the op did not declare it; [`Error::Graph`]
    /// off its device, or after its graph was dropped; [`Error::Stream`]
    /// off a stream device, or if the device could not allocate the arena.
    pub fn device_buffer<T: Element>(
        &self,
        buffer: &DeviceBuffer<T>,
    ) -> Result<DeviceSlice<T>, Error> {
        self.find(buffer.key())?;
        self.device_slice(buffer, false)
    }

    /// A writable view of a planned device buffer the op declared as
    /// mutated. See [`device_buffer`](Self::device_buffer).
    ///
    /// # Errors
    ///
    /// As for `device_buffer`, and [`Error::NotMutable`] if the op only
    /// reads it.
    pub fn device_buffer_mut<T: Element>(
        &self,
        buffer: &DeviceBuffer<T>,
    ) -> Result<DeviceSlice<T>, Error> {
        let (_, edge) = self.find(buffer.key())?;
        if !edge.is_write() {
            return Err(Error::NotMutable(buffer.id()));
        }
        self.device_slice(buffer, true)
    }

    fn device_slice<T: Element>(
        &self,
        buffer: &DeviceBuffer<T>,
        writable: bool,
    ) -> Result<DeviceSlice<T>, Error> {
        let device = self.device().index;
        if device != buffer.arena.device {
            return Err(Error::Graph(format!(
                "device buffer {} lives on device {}, but this op runs on device {device}",
                buffer.id(),
                buffer.arena.device
            )));
        }
        let stream = self.stream()?;
        buffer
            .arena
            .slice(stream, buffer.slot, buffer.len, writable)
    }
}

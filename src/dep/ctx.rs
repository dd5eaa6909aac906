//! What an op's body sees: the values of the variables it declared, and
//! what it names them by ([`Operand`]: a variable, its key, or a planned
//! buffer, alike).
//!
//! Access is checked against the op's declaration at run time: reading a
//! variable the op did not declare, or mutating one it declared as read, is an
//! [`Error`], never undefined behaviour. Borrows of a mutated variable are
//! tracked like a `RefCell`'s, so a body cannot hold `&mut T` and `&T` of the
//! same variable at once.

// `unsafe`: a body's access to the values of its variables, under their grants; each block says why
// it is sound.
#![allow(unsafe_code)]

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicI32, AtomicPtr, Ordering};
use std::task::Waker;

use super::block::{OpBlock, OpEdge};
use super::var::{AnyVar, Var, VarKey, VarState};
use crate::device::Stream;
use crate::error::{Error, VarId};
use crate::resource::Held;

/// Borrow counter value of a variable borrowed mutably.
pub(super) const MUT: i32 = -1;

/// An op on up to this many variables finds one by scanning its edges; a
/// bigger one through an index sorted by id, built by its first lookup (a
/// scan per lookup made an op reading all of 100,000 variables quadratic).
const SCAN_MAX: usize = 16;

/// The edges of an op on more than `SCAN_MAX` variables, as (variable,
/// edge index) sorted by variable.
type Index = Vec<(VarId, usize)>;

/// What a body's context gets from the op's future, besides the op.
pub(crate) struct Env<'a> {
    /// The op's stream, on a stream device.
    pub(crate) stream: Option<&'a Stream>,
    /// The id of the op's engine.
    pub(crate) engine: u64,
    /// What releases the op's grants when a leased context is dropped
    /// (`lifecycle::lease_dropped` for the op's host; its contract: called
    /// with the op it was made for, before the op retires).
    pub(crate) lease_dropped: unsafe fn(&OpBlock),
}

/// A device of an engine: where an op runs. Cheap to copy.
///
/// Get one from [`Engine::device`](crate::Engine::device) or
/// [`Engine::default_device`](crate::Engine::default_device), and pick it for an
/// op with [`OpBuilder::on`](crate::OpBuilder::on).
///
/// ```
/// use depflow::{Engine, Error, Executor};
///
/// let engine = Engine::builder().device("gpu1", Executor::pool(1)).build()?;
/// let gpu1 = engine.device("gpu1").unwrap();
/// assert_eq!(gpu1.index(), 1);
/// let v = engine.new_var();
/// let device = engine.op().on(gpu1).mutates(&[&v]).run(|ctx| Ok(ctx.device()))?.wait()?;
/// assert_eq!(device, gpu1);
/// # Ok::<(), Error>(())
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Device {
    pub(crate) engine: u64,
    pub(crate) index: u16,
}

impl Device {
    pub(crate) fn new(engine: u64, index: u16) -> Self {
        Self { engine, index }
    }

    /// The device's position in its engine (0 is the default device).
    pub fn index(&self) -> usize {
        self.index as usize
    }
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Device({})", self.index)
    }
}

/// The context an op's body runs in: it gives access to the values of the
/// variables the op declared.
///
/// A synchronous op ([`Engine::push`](crate::Engine::push)) gets `&OpCtx` for
/// the duration of its closure. An async op
/// ([`Engine::push_async`](crate::Engine::push_async)) owns its `OpCtx`: the
/// op keeps its dependencies until both its future has finished and the
/// context has been dropped, so a context that escapes the future keeps the
/// variables locked until it is dropped.
///
/// ```
/// let engine = depflow::Engine::new();
/// let a = engine.var(2);
/// let b = engine.var(0);
/// engine
///     .push(&[&a], &[&b], {
///         let (a, b) = (a.clone(), b.clone());
///         move |ctx| {
///             *ctx.write(&b)? = *ctx.read(&a)? + 1;
///             Ok(())
///         }
///     })?
///     .wait()?;
/// # Ok::<(), depflow::Error>(())
/// ```
pub struct OpCtx {
    op: *const OpBlock,
    /// The op's first `SCAN_MAX` edges (all of most ops'), which its block
    /// keeps in place while the context lives: at hand for each lookup,
    /// bounded once rather than per lookup.
    scanned: *const [OpEdge],
    /// One borrow counter per mutated variable, at the index of its edge
    /// (writes come first among the op's edges); reads need none.
    borrows: Borrows,
    /// For a leased context (an async body's).
    lease: Option<Lease>,
    /// The op's stream on a stream device (null elsewhere); it outlives the
    /// borrowed context, which lives within the body's call.
    stream: *const Stream,
    /// The id of the op's engine.
    engine: u64,
    /// For an op on more than `SCAN_MAX` variables: its index (a leaked
    /// `Box`, freed on drop), once a lookup built it; null before. Kept
    /// here, not in the op's block, so that ops do not grow; a pointer, so
    /// that a context without one costs a store and a test.
    index: AtomicPtr<Index>,
}

/// What a leased context holds of its op.
struct Lease {
    /// A waker of the op's task, keeping its allocation (and so `op`) alive
    /// for as long as the context lives.
    anchor: Waker,
    /// Releases the op's grants if the future finished first (see
    /// `Env::lease_dropped`).
    dropped: unsafe fn(&OpBlock),
}

// SAFETY: `op` points to the `Sync` metadata of a task kept alive for the
// context's lifetime; the other fields are `Send + Sync`.
unsafe impl Send for OpCtx {}
// SAFETY: as above.
unsafe impl Sync for OpCtx {}

/// The borrow counters of an op's mutated variables, by edge index: the
/// first two inline (most ops mutate one or two variables; an op on one or
/// two variables counts its reads too, which costs nothing), the others in
/// a `Vec`, empty (unallocated) for most ops. Not a `Few` (a three-way
/// match per access) and made without counting the writes: every body
/// pays for both (19 to 28 instructions per replayed op of
/// `benches/workloads.rs`, callgrind).
struct Borrows {
    first: [AtomicI32; 2],
    rest: Vec<AtomicI32>,
}

impl Borrows {
    /// Counters for `op`: one per mutated variable, at least two.
    #[inline]
    fn of(op: &OpBlock) -> Self {
        let edges = op.edges();
        Self {
            first: [AtomicI32::new(0), AtomicI32::new(0)],
            // Writes come first: a third one is at edge 2.
            rest: match edges.get(2) {
                Some(third) if third.is_write() => Self::rest(edges),
                _ => Vec::new(),
            },
        }
    }

    /// The counters past the first two, for an op mutating more than two
    /// variables (rare: out of line).
    #[cold]
    #[inline(never)]
    fn rest(edges: &[OpEdge]) -> Vec<AtomicI32> {
        let writes = edges.iter().take_while(|e| e.is_write()).count();
        (2..writes).map(|_| AtomicI32::new(0)).collect()
    }

    /// The counter of the mutated variable at edge `i`.
    #[inline(always)]
    fn at(&self, i: usize) -> &AtomicI32 {
        match i {
            0 | 1 => &self.first[i],
            _ => &self.rest[i - 2],
        }
    }

    /// Sets every counter back to 0 (no borrow).
    #[inline]
    fn clear(&self) {
        self.first
            .iter()
            .chain(&self.rest)
            .for_each(|c| c.store(0, Ordering::Relaxed));
    }
}

/// The edges of `op` a lookup scans: its first `SCAN_MAX`.
#[inline]
fn scanned(op: &OpBlock) -> *const [OpEdge] {
    let edges = op.edges();
    &edges[..edges.len().min(SCAN_MAX)]
}

impl OpCtx {
    /// A context borrowed for one call of a synchronous body.
    #[inline]
    pub(crate) fn borrowed(op: &OpBlock, env: &Env<'_>) -> Self {
        Self {
            op,
            scanned: scanned(op),
            borrows: Borrows::of(op),
            lease: None,
            stream: env.stream.map_or(std::ptr::null(), |s| s),
            engine: env.engine,
            index: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The context of a recorded op (`dep::resident`), made once and lent
    /// to each of its runs ([`lend`](Self::lend)): a replay builds and
    /// drops none. It outlives no run's borrows (they live within the
    /// body's call), and keeps its index from one run to the next.
    pub(crate) fn resident(op: &OpBlock, engine: u64) -> Self {
        Self {
            op,
            scanned: scanned(op),
            borrows: Borrows::of(op),
            lease: None,
            stream: std::ptr::null(),
            engine,
            index: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// A resident context, ready for one more run: a borrow the last run
    /// forgot (`mem::forget` of a guard) is undone.
    #[inline]
    pub(crate) fn lend(&self) -> &Self {
        self.borrows.clear();
        self
    }

    /// A context owned by an async body; `anchor` is a waker of the op's
    /// task. From now on the op's future and this context each hold its
    /// grants: the last of the two to go releases them.
    pub(crate) fn leased(op: &OpBlock, env: &Env<'_>, anchor: Waker) -> Self {
        // Not started before: the lease count is 0 (a cancel bit may be set).
        op.status.fetch_or(2, Ordering::Relaxed);
        Self {
            op,
            scanned: scanned(op),
            borrows: Borrows::of(op),
            lease: Some(Lease {
                anchor,
                dropped: env.lease_dropped,
            }),
            stream: std::ptr::null(),
            engine: env.engine,
            index: AtomicPtr::new(std::ptr::null_mut()),
        }
    }

    /// The edges a lookup scans (`SCAN_MAX` at most).
    #[inline]
    fn scanned(&self) -> &[OpEdge] {
        // SAFETY: as in `op`: the block (and so its edges, which never
        // change once it is made) is alive while the context is.
        unsafe { &*self.scanned }
    }

    #[inline]
    fn op(&self) -> &OpBlock {
        // SAFETY: a borrowed context lives within the body's call, during which
        // the task (and its metadata) is alive; a leased one holds a waker of
        // the task, which keeps the allocation alive.
        unsafe { &*self.op }
    }

    /// The op's edge on the variable `key` names: found by a scan of the
    /// first `SCAN_MAX` edges (bounded when the context was made), then, out
    /// of line, in the index if there are more (so that an op on one or two
    /// variables pays for neither).
    #[inline]
    pub(super) fn find<T>(&self, key: VarKey<T>) -> Result<(usize, &OpEdge), Error> {
        match self
            .scanned()
            .iter()
            .enumerate()
            .find(|(_, e)| key.names(&e.var))
        {
            Some(found) => Ok(found),
            None => self.find_indexed(key.id()),
        }
    }

    /// [`find`](Self::find) past the scanned edges: for an op on many
    /// variables a binary search in the index, which the first lookup
    /// builds; for the others, not declared.
    #[cold]
    #[inline(never)]
    fn find_indexed(&self, id: VarId) -> Result<(usize, &OpEdge), Error> {
        let edges = self.op().edges();
        if edges.len() <= SCAN_MAX {
            return Err(Error::NotDeclared(id));
        }
        let mut index = self.index.load(Ordering::Acquire);
        if index.is_null() {
            let mut built: Index = edges
                .iter()
                .enumerate()
                .map(|(i, e)| (e.var.id(), i))
                .collect();
            built.sort_unstable();
            let built = Box::into_raw(Box::new(built));
            index = match self.index.compare_exchange(
                std::ptr::null_mut(),
                built,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => built,
                Err(first) => {
                    // Another thread of the body built it first.
                    // SAFETY: `built` came from `Box::into_raw` above and
                    // was never shared.
                    drop(unsafe { Box::from_raw(built) });
                    first
                }
            };
        }
        // SAFETY: set once (the exchange above) from a live `Box`, freed
        // only by `drop`, which has `&mut self`.
        let index = unsafe { &*index };
        let at = index
            .binary_search_by_key(&id, |&(var, _)| var)
            .map_err(|_| Error::NotDeclared(id))?;
        let i = index[at].1;
        Ok((i, &edges[i]))
    }

    /// Borrows the value of a variable or planned buffer the op declared
    /// (read or mutated): `operand` is the variable (`&Var<T>`, giving a
    /// `VarRef<T>`), its [`VarKey`], or a planned buffer (`&Buffer<T>`,
    /// giving a `VarRef<[T]>`; see [`Operand`]).
    ///
    /// # Errors
    ///
    /// [`Error::NotDeclared`] if the op did not declare it;
    /// [`Error::Borrowed`] if the body holds a mutable borrow of it;
    /// [`Error::Deleted`] for a variable without a value; [`Error::Graph`]
    /// for a planned buffer reached before its recording ended.
    // Always: with the index's cold path in `find`, the inliner would
    // keep `read` out of line in small bodies (+35 instructions an op in
    // `benches/push_cost.rs` read2).
    #[inline(always)]
    pub fn read<O: Operand>(&self, operand: O) -> Result<VarRef<'_, O::Value>, Error> {
        operand.read_in(self)
    }

    /// Mutably borrows the value of a variable or planned buffer the op
    /// declared as mutated: `operand` as for [`read`](Self::read).
    ///
    /// # Errors
    ///
    /// [`Error::NotDeclared`] if the op did not declare it;
    /// [`Error::NotMutable`] if it declared it as read only;
    /// [`Error::Borrowed`] if the body already borrows it; otherwise as for
    /// [`read`](Self::read).
    #[inline]
    pub fn write<O: Operand>(&self, operand: O) -> Result<VarMut<'_, O::Value>, Error> {
        operand.write_in(self)
    }

    /// [`read`](Self::read) of a variable, by its key.
    #[inline(always)]
    pub(super) fn read_key<T>(&self, key: VarKey<T>) -> Result<VarRef<'_, T>, Error>
    where
        T: Send + Sync + 'static,
    {
        let (i, edge) = self.find(key)?;
        let count = if edge.is_write() {
            let count = self.borrows.at(i);
            count
                .fetch_update(Ordering::Acquire, Ordering::Relaxed, |c| {
                    (c != MUT).then_some(c + 1)
                })
                .map_err(|_| Error::Borrowed(key.id()))?;
            Some(count)
        } else {
            None
        };
        // SAFETY: the key names this edge's variable, so `T` is its value type
        // (keys are made only from a `Var<T>`, and ids are unique); the op
        // holds a grant on it while this context lives, and the borrow count
        // excludes a live mutable borrow from this body.
        match unsafe { (*edge.var.value::<T>().get()).as_ref() } {
            Some(value) => Ok(VarRef { value, count }),
            None => {
                if let Some(c) = count {
                    c.fetch_sub(1, Ordering::Release);
                }
                Err(Error::Deleted(key.id()))
            }
        }
    }

    /// [`write`](Self::write) of a variable, by its key.
    #[inline]
    pub(super) fn write_key<T>(&self, key: VarKey<T>) -> Result<VarMut<'_, T>, Error>
    where
        T: Send + Sync + 'static,
    {
        let (_, count, edge) = self.claim(key)?;
        // SAFETY: as in `read`; the op holds the write grant, and the borrow
        // count makes this the only borrow of the value.
        match unsafe { (*edge.var.value::<T>().get()).as_mut() } {
            Some(value) => Ok(VarMut { value, count }),
            None => {
                count.store(0, Ordering::Release);
                Err(Error::Deleted(key.id()))
            }
        }
    }

    /// Deletes the variable `key` names: marks it deleted and takes its
    /// value and the resource units it holds (to give back once the value is
    /// recycled). The op declared it as mutated, and the body does not
    /// borrow it.
    pub(crate) fn delete<T>(&self, key: VarKey<T>) -> Result<(Option<T>, Held), Error>
    where
        T: Send + Sync + 'static,
    {
        let (_, count, edge) = self.claim(key)?;
        // SAFETY: as in `write`: the write grant and the exclusive borrow.
        let taken = unsafe {
            edge.var.set_state(VarState::Deleted);
            ((*edge.var.value::<T>().get()).take(), edge.var.take_units())
        };
        count.store(0, Ordering::Release);
        Ok(taken)
    }

    /// Clears the poison of the variable `key` names (declared as mutated).
    pub(crate) fn clear_poison<T>(&self, key: VarKey<T>) -> Result<(), Error>
    where
        T: Send + Sync + 'static,
    {
        let (_, count, edge) = self.claim(key)?;
        // SAFETY: the op holds the write grant on the variable.
        unsafe { edge.var.set_state(VarState::Live) };
        count.store(0, Ordering::Release);
        Ok(())
    }

    /// The borrow counter of the op's mutated variable at edge `i`.
    #[inline]
    pub(super) fn borrow_counter(&self, i: usize) -> &AtomicI32 {
        self.borrows.at(i)
    }

    /// Borrows the variable `key` names exclusively: the op declared it as
    /// mutated and the body holds no borrow of it. Release with a store of 0.
    #[inline]
    pub(super) fn claim<T>(&self, key: VarKey<T>) -> Result<(usize, &AtomicI32, &OpEdge), Error> {
        let (i, edge) = self.find(key)?;
        if !edge.is_write() {
            return Err(Error::NotMutable(key.id()));
        }
        let count = self.borrows.at(i);
        count
            .compare_exchange(0, MUT, Ordering::Acquire, Ordering::Relaxed)
            .map_err(|_| Error::Borrowed(key.id()))?;
        Ok((i, count, edge))
    }

    /// The op's name, if it was given one.
    pub fn name(&self) -> Option<&str> {
        self.op().name()
    }

    /// The device the op runs on.
    pub fn device(&self) -> Device {
        Device::new(self.engine, self.op().device_index())
    }

    /// The stream to enqueue the op's work on, for an op on a stream device
    /// (`Executor::cuda` with the `cuda` feature,
    /// [`Executor::simulated_gpu`](crate::Executor::simulated_gpu)).
    /// See [`Stream`] for an example.
    ///
    /// # Errors
    ///
    /// [`Error::Stream`] if the op does not run on a stream device.
    pub fn stream(&self) -> Result<&Stream, Error> {
        // SAFETY: a non-null `stream` outlives this borrowed context (see the
        // field).
        unsafe { self.stream.as_ref() }
            .ok_or_else(|| Error::Stream("the op does not run on a stream device".into()))
    }
}

impl Drop for OpCtx {
    #[inline]
    fn drop(&mut self) {
        // Most contexts have neither: the test stays inline, the work not.
        if !self.index.get_mut().is_null() || self.lease.is_some() {
            self.release();
        }
    }
}

impl OpCtx {
    /// Frees the index and ends the lease, for [`Drop`].
    #[cold]
    #[inline(never)]
    fn release(&mut self) {
        let index = *self.index.get_mut();
        if !index.is_null() {
            // SAFETY: a non-null index came from `Box::into_raw` in
            // `find_indexed`, and nothing borrows it once we have `&mut self`.
            drop(unsafe { Box::from_raw(index) });
        }
        if let Some(lease) = self.lease.take() {
            // SAFETY: `dropped` was made for this op's host by its future
            // (`Env`), and the op has not retired: its future or this lease
            // still holds its grants.
            unsafe { (lease.dropped)(self.op()) };
            drop(lease.anchor);
        }
    }
}

impl std::fmt::Debug for OpCtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpCtx").field("op", self.op()).finish()
    }
}

/// A shared borrow of a variable's value, from [`OpCtx::read`]; it derefs to
/// `&T`.
///
/// ```
/// let engine = depflow::Engine::new();
/// let v = engine.var(vec![1, 2, 3]);
/// let k = v.key();
/// let sum = engine.push(&[&v], &[], move |ctx| {
///     let values = ctx.read(k)?; // a VarRef<Vec<i32>>
///     Ok(values.iter().sum::<i32>())
/// })?;
/// assert_eq!(sum.wait()?, 6);
/// # Ok::<(), depflow::Error>(())
/// ```
pub struct VarRef<'a, T: ?Sized> {
    pub(super) value: &'a T,
    pub(super) count: Option<&'a AtomicI32>,
}

impl<T: ?Sized> Deref for VarRef<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.value
    }
}

impl<T: ?Sized> Drop for VarRef<'_, T> {
    fn drop(&mut self) {
        if let Some(c) = self.count {
            c.fetch_sub(1, Ordering::Release);
        }
    }
}

impl<T: std::fmt::Debug + ?Sized> std::fmt::Debug for VarRef<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.value.fmt(f)
    }
}

/// A mutable borrow of a variable's value, from [`OpCtx::write`]; it derefs
/// to `&mut T`.
///
/// ```
/// let engine = depflow::Engine::new();
/// let v = engine.var(String::new());
/// let k = v.key();
/// engine.push(&[], &[&v], move |ctx| {
///     let mut s = ctx.write(k)?; // a VarMut<String>
///     s.push_str("written");
///     Ok(())
/// })?;
/// # Ok::<(), depflow::Error>(())
/// ```
pub struct VarMut<'a, T: ?Sized> {
    pub(super) value: &'a mut T,
    pub(super) count: &'a AtomicI32,
}

impl<T: ?Sized> Deref for VarMut<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.value
    }
}

impl<T: ?Sized> DerefMut for VarMut<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.value
    }
}

impl<T: ?Sized> Drop for VarMut<'_, T> {
    fn drop(&mut self) {
        self.count.store(0, Ordering::Release);
    }
}

impl<T: std::fmt::Debug + ?Sized> std::fmt::Debug for VarMut<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.value.fmt(f)
    }
}

// ---- What a body reaches through its context: an `Operand` (a variable,
// its key, or a planned buffer), and the declarable ones with a known value
// type, `TypedVar`, which typed access (`read(&x)`, `write(&y)`) takes. One
// trait for both kinds, so that a body does not care whether its operand is
// a variable (`Var<T>`, value `T`) or a planned buffer (`Buffer<T>`, value
// `[T]`); buffers implement it in `buffer`.

/// Seals [`Operand`]: implemented here and in `buffer` only.
pub(super) mod operand_sealed {
    pub trait Sealed {}
}

/// Something an op's body reads or writes through its context: a variable
/// (`&Var<T>`, or its [`VarKey<T>`]), whose value is `T`, or a planned
/// buffer (`&Buffer<T>`), whose value is `[T]`. Sealed.
///
/// ```
/// use depflow::Engine;
///
/// let engine = Engine::new();
/// let (n, total) = (engine.var(3u32), engine.var(0u32));
/// let graph = engine.record(|rec| {
///     let squares = rec.buffer::<u32>(4); // a planned buffer
///     rec.op().reads(&[&n]).mutates(&[&squares]).run({
///         let (n, squares) = (n.key(), squares.clone());
///         move |ctx| {
///             let n = *ctx.read(n)?; // a variable's key: a `u32`
///             for (i, s) in ctx.write(&squares)?.iter_mut().enumerate() {
///                 *s = n * i as u32; // the buffer: a `[u32]`
///             }
///             Ok(())
///         }
///     })?;
///     rec.op().reads(&[&squares]).mutates(&[&total]).run({
///         let (squares, total) = (squares.clone(), total.clone());
///         move |ctx| {
///             *ctx.write(&total)? = ctx.read(&squares)?.iter().sum();
///             Ok(())
///         }
///     })
/// })?;
/// graph.replay().wait()?;
/// assert_eq!(engine.get(&total).wait()?, 18);
/// # Ok::<(), depflow::Error>(())
/// ```
pub trait Operand: operand_sealed::Sealed {
    /// What a body borrows: `T` for a variable of `T`, `[T]` for a buffer
    /// of `T`.
    type Value: ?Sized + Send + Sync + 'static;

    /// Borrows the value in `ctx` (see [`OpCtx::read`]).
    #[doc(hidden)]
    fn read_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarRef<'c, Self::Value>, Error>;

    /// Borrows the value mutably in `ctx` (see [`OpCtx::write`]).
    #[doc(hidden)]
    fn write_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarMut<'c, Self::Value>, Error>;
}

/// A variable an op may declare whose value type is known: a [`Var<T>`] or
/// a planned [`Buffer<T>`](crate::Buffer). What [`read()`](crate::read) and
/// [`write()`](crate::write) take. Sealed.
pub trait TypedVar: AnyVar + Operand {
    /// What an op's body keeps to reach it: a copyable key for a variable,
    /// a handle for a buffer.
    #[doc(hidden)]
    type Key: Operand<Value = Self::Value> + Clone + Send + Sync + 'static;

    #[doc(hidden)]
    fn typed_key(&self) -> Self::Key;
}

impl<T> operand_sealed::Sealed for VarKey<T> {}
impl<T> operand_sealed::Sealed for Var<T> {}
impl<O: operand_sealed::Sealed + ?Sized> operand_sealed::Sealed for &O {}

impl<T: Send + Sync + 'static> Operand for VarKey<T> {
    type Value = T;

    #[inline(always)]
    fn read_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarRef<'c, T>, Error> {
        ctx.read_key(*self)
    }

    #[inline(always)]
    fn write_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarMut<'c, T>, Error> {
        ctx.write_key(*self)
    }
}

impl<T: Send + Sync + 'static> Operand for Var<T> {
    type Value = T;

    #[inline(always)]
    fn read_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarRef<'c, T>, Error> {
        ctx.read_key(self.key())
    }

    #[inline(always)]
    fn write_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarMut<'c, T>, Error> {
        ctx.write_key(self.key())
    }
}

impl<O: Operand + ?Sized> Operand for &O {
    type Value = O::Value;

    #[inline(always)]
    fn read_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarRef<'c, O::Value>, Error> {
        (**self).read_in(ctx)
    }

    #[inline(always)]
    fn write_in<'c>(&self, ctx: &'c OpCtx) -> Result<VarMut<'c, O::Value>, Error> {
        (**self).write_in(ctx)
    }
}

impl<T: Send + Sync + 'static> TypedVar for Var<T> {
    type Key = VarKey<T>;

    #[inline]
    fn typed_key(&self) -> VarKey<T> {
        self.key()
    }
}

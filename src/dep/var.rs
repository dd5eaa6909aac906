//! Variables: the tags that ops declare, and the values they may own.
//!
//! A [`Var<T>`] is a handle to one variable. `Var<()>` (what
//! [`Engine::new_var`](crate::Engine::new_var) returns) is the seed's plain
//! tag: it stands for a resource the engine does not own (device memory, a
//! file, an RNG held elsewhere). `Var<T>` for another `T` owns a value that
//! ops reach through their [`OpCtx`](crate::OpCtx): `&T` for an op that
//! declared the variable as read, `&mut T` for one that declared it mutated.
//!
//! A variable is one allocation: its engine-side state ([`VarCore`]: the
//! dependency chain, the version, and whether it is live, poisoned or
//! deleted) followed by its value. Ops hold a type-erased strong reference to
//! it ([`VarHold`]) for as long as they may touch it. The state and the value
//! are plain cells: the chain's grants are what make access to them exclusive
//! (a granted write) or shared (granted reads), so they need no lock.
//!
//! # Who touches what
//!
//! | field | written by | read by |
//! | --- | --- | --- |
//! | `engine`, `id`, `release`, `take_value` | creation | anyone |
//! | `deleted` | the pusher of a delete (`swap`) | pushers |
//! | `chain` | see `core::chain` | |
//! | `version` | the op holding the write grant | anyone (a snapshot) |
//! | `state`, `held` | the op holding the write grant; `Drop` | ops holding a grant |
//! | `fences` | ops holding a grant (under its lock) | ops holding a grant |
//! | `device` | stream ops holding a grant (`Written::touched_by`) | `Drop` |
//! | the value | the op holding the write grant | ops holding a grant |
//!
//! # Where the value is dropped
//!
//! Where the variable's last reference goes (an op retiring, the last
//! [`Var`] handle dropped), except for a value a stream device touched
//! (`device`, set only by stream ops): dropped on a thread that does not
//! keep that device's context current (a host op's worker, the user's
//! thread), it goes to the device's poller, with the units the variable
//! holds (given back after it), to be dropped there (`device::context`):
//! a `CudaSlice` is freed with the context current on the dropping thread.

// `unsafe`: type-erased variables, and their state under the chain's grants; each block says why it
// is sound.
#![allow(unsafe_code)]

use std::fmt;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use super::block::OpBlock;
use crate::core::chain::Chain;
use crate::device::context::{self, DeviceOf};
use crate::device::poller::Wake;
use crate::device::{Deferred, VarFences};
use crate::error::{OpFailure, VarId, names};
use crate::loom::cell::UnsafeCell;
use crate::resource::{Held, Resource, Revocable};

/// Variable ids are unique across all engines of the process, so that a
/// [`VarKey`] can never be mistaken for another variable.
static NEXT_VAR_ID: AtomicU64 = AtomicU64::new(0);

/// What a variable holds, as seen by the op that holds a grant on it.
#[derive(Clone, Debug)]
pub(crate) enum VarState {
    Live,
    Poisoned(Arc<OpFailure>),
    Deleted,
}

/// The engine-side state of one variable. Not nameable outside the crate.
///
/// Laid out by who touches what: what a push reads (identity, `deleted`)
/// first, then the chain: its append line, then its grant line, which also
/// carries what the ops holding grants read and write (`version`, `state`).
#[doc(hidden)]
#[repr(C)]
pub struct VarCore {
    engine: u64,
    id: VarId,
    /// The recorded graph whose intermediate this is (see `crate::graph`),
    /// or 0: only that graph's ops may declare it.
    graph: u64,
    /// Drops one strong reference to the `Arc<VarInner<T>>` this core heads.
    release: unsafe fn(NonNull<VarCore>),
    /// Takes the value of the `VarInner<T>` this core heads, with the units
    /// the variable holds, to drop elsewhere (see [`take_value`]).
    take_value: unsafe fn(NonNull<VarCore>) -> Option<Deferred>,
    /// A delete has been pushed: later pushes are refused.
    deleted: AtomicBool,
    /// Its id has a name in `error::names`, to forget when it is freed.
    named: bool,
    /// Dropping the value runs code (`needs_drop`): user code, which may
    /// panic (see `OpBlock::release_vars`).
    value_drops: bool,
    pub(crate) chain: Chain<OpBlock, Written>,
}

/// What ops holding a grant on a variable read and update.
#[derive(Debug)]
pub(crate) struct Written {
    version: AtomicU64,
    /// Read by ops holding a grant, written by ops holding a write grant.
    state: UnsafeCell<VarState>,
    /// Resource units allocated to the variable (see `OpBuilder::allocates`),
    /// one entry per resource; touched only under the write grant or by
    /// `Drop`.
    held: UnsafeCell<Held>,
    /// Device work on the variable that host access must wait for (see
    /// `core::fence`); empty unless a stream device touched it.
    fences: VarFences,
    /// The stream device the value belongs to, if one touched it (module
    /// docs: where the value is dropped).
    device: DeviceOf,
}

// SAFETY: `state` and `held` are accessed only under the chain's grants (see
// `VarCore`), or exclusively in `Drop`.
unsafe impl Sync for Written {}

impl VarCore {
    #[inline]
    pub(crate) fn id(&self) -> VarId {
        self.id
    }

    #[inline]
    pub(crate) fn engine(&self) -> u64 {
        self.engine
    }

    /// The id of the recorded graph owning the variable (an intermediate),
    /// or 0.
    #[inline]
    pub(crate) fn graph(&self) -> u64 {
        self.graph
    }

    /// Whether dropping the variable's value runs code (it may panic).
    #[inline]
    pub(crate) fn value_drops(&self) -> bool {
        self.value_drops
    }

    /// The device work the variable waits for.
    #[inline]
    pub(crate) fn fences(&self) -> &VarFences {
        &self.chain.payload().fences
    }

    /// A stream op of the device whose poller is `device` touched the
    /// variable (`write`: mutated it), holding its grant: the value is
    /// that device's from now on (a read's device counts only if there is
    /// none), and is dropped on its poller (module docs).
    #[inline]
    pub(crate) fn touched_by(&self, device: &Arc<Wake>, write: bool) {
        self.chain.payload().device.touched_by(device, write);
    }

    pub(crate) fn version(&self) -> u64 {
        self.chain.payload().version.load(Ordering::Acquire)
    }

    /// Counts one completed mutation; called by the op holding the write
    /// grant, the only writer (so no read-modify-write is needed).
    #[inline]
    pub(crate) fn bump_version(&self) {
        let v = self.chain.payload().version.load(Ordering::Relaxed);
        self.chain.payload().version.store(v + 1, Ordering::Release);
    }

    #[inline]
    pub(crate) fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    /// Marks a delete as pushed. Returns `false` if one already was.
    pub(crate) fn mark_deleted(&self) -> bool {
        !self.deleted.swap(true, Ordering::AcqRel)
    }

    /// Whether the variable is live (not poisoned, not deleted).
    ///
    /// # Safety
    ///
    /// The calling op holds a granted edge (read or write) on this variable.
    #[inline]
    pub(crate) unsafe fn is_live(&self) -> bool {
        // SAFETY: a grant excludes writers, the only ones that modify it.
        self.chain
            .payload()
            .state
            .with(|s| unsafe { matches!(*s, VarState::Live) })
    }

    /// The variable's state.
    ///
    /// # Safety
    ///
    /// As for [`is_live`](Self::is_live).
    pub(crate) unsafe fn state(&self) -> VarState {
        // SAFETY: a grant excludes writers, the only ones that modify it.
        self.chain.payload().state.with(|s| unsafe { (*s).clone() })
    }

    /// Replaces the variable's state.
    ///
    /// # Safety
    ///
    /// The calling op holds the granted write edge on this variable.
    pub(crate) unsafe fn set_state(&self, state: VarState) {
        // SAFETY: a granted write is exclusive.
        self.chain
            .payload()
            .state
            .with_mut(|s| unsafe { *s = state });
    }
}

impl VarCore {
    /// Makes the variable hold `amount` units of `resource`, replacing what
    /// it held of it, whose amount is returned (to give back).
    ///
    /// # Safety
    ///
    /// The calling op holds the granted write edge on this variable.
    pub(crate) unsafe fn hold_units(&self, resource: &Resource, amount: u64) -> Option<u64> {
        self.chain
            .payload()
            .held
            // SAFETY: a granted write is exclusive.
            .with_mut(|held| unsafe { (*held).replace(resource, amount) })
    }

    /// Makes the variable hold `units` (a stream op's, which it takes back
    /// if its device work fails), replacing what it held of their resource,
    /// whose amount is returned (to give back).
    ///
    /// # Safety
    ///
    /// As for [`hold_units`](Self::hold_units).
    pub(crate) unsafe fn hold_revocable_units(&self, units: &Revocable) -> Option<u64> {
        self.chain
            .payload()
            .held
            // SAFETY: a granted write is exclusive.
            .with_mut(|held| unsafe { (*held).replace_revocable(units) })
    }

    /// Takes every unit the variable holds (it is being deleted); they go
    /// back when the returned guard is dropped.
    ///
    /// # Safety
    ///
    /// As for [`hold_units`](Self::hold_units).
    pub(crate) unsafe fn take_units(&self) -> Held {
        self.chain
            .payload()
            .held
            // SAFETY: a granted write is exclusive.
            .with_mut(|held| std::mem::replace(unsafe { &mut *held }, Held::new(self.id)))
    }
}

impl Drop for VarCore {
    fn drop(&mut self) {
        // SAFETY: `&mut self`: nothing else can reach the variable. (Its value,
        // if any, was dropped before: see `VarInner`'s `Drop`.)
        drop(unsafe { self.take_units() });
        if self.named {
            names::unregister(self.id);
        }
        // Every op holds its variables, so a variable dies only after the last
        // op on it has left its chain.
        debug_assert!(
            self.chain.is_idle(),
            "variable dropped with ops in its chain"
        );
    }
}

impl fmt::Debug for VarCore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("VarCore")
            .field("id", &self.id)
            .field("version", &self.version())
            .field("chain", &self.chain)
            .finish()
    }
}

/// A variable's allocation: the core first (so that a pointer to the
/// allocation is a pointer to the core), then the value.
#[repr(C)]
struct VarInner<T> {
    core: VarCore,
    value: std::cell::UnsafeCell<Option<T>>,
}

// SAFETY: the value is shared across threads only under the chain's grants:
// shared references for concurrent readers (needs `T: Sync`), a unique one for
// the single writer, which may run on any thread (needs `T: Send`).
unsafe impl<T: Send + Sync> Sync for VarInner<T> {}
// SAFETY: as above.
unsafe impl<T: Send + Sync> Send for VarInner<T> {}

impl<T> Drop for VarInner<T> {
    fn drop(&mut self) {
        if self.core.value_drops
            && let Some(device) = self.core.chain.payload().device.take()
            && !context::is_current(&device)
        {
            // A stream device's value, dropped elsewhere: on its poller
            // instead (module docs), with the units, which go back after it.
            // SAFETY: this core heads this `VarInner<T>`, whose `take_value`
            // was made for `T`; `&mut self`: nothing else reaches it. The
            // pointer is the whole allocation's.
            let taken = unsafe { (self.core.take_value)(NonNull::from(&mut *self).cast()) };
            if let Some(taken) = taken
                && let Err(back) = device.defer(taken)
            {
                drop(back); // the device was shut down: here, as before
            }
            return;
        }
        // The value first: the units the variable holds (dropped with the
        // core) stand for its memory, so they go back only once it is freed.
        drop(self.value.get_mut().take());
    }
}

/// Takes the value of an `Arc<VarInner<T>>` being dropped, given its core,
/// with the units the variable holds: one box that drops the value, then
/// gives the units back.
///
/// # Safety
///
/// `core` points to a `VarInner<T>` that the caller has exclusive access
/// to (it is being dropped), with the whole allocation's provenance.
unsafe fn take_value<T: Send + 'static>(core: NonNull<VarCore>) -> Option<Deferred> {
    // SAFETY: as the caller promises; `VarInner` is `repr(C)` with the core
    // first.
    let inner = unsafe { &mut *core.as_ptr().cast::<VarInner<T>>() };
    let value = inner.value.get_mut().take()?;
    // SAFETY: exclusive, as above.
    let units = unsafe { inner.core.take_units() };
    // A tuple drops its fields in order: the value, then the units.
    Some(Box::new((value, units)))
}

/// Drops one strong reference to an `Arc<VarInner<T>>` given its core.
///
/// # Safety
///
/// `core` came from `Arc::into_raw` of an `Arc<VarInner<T>>`, whose reference
/// the caller gives up.
unsafe fn release<T>(core: NonNull<VarCore>) {
    // SAFETY: `VarInner` is `repr(C)` with the core first, so the pointers
    // coincide; the reference is the caller's to drop.
    drop(unsafe { Arc::from_raw(core.as_ptr().cast::<VarInner<T>>()) });
}

/// A strong, type-erased reference to a variable: what an op's edge holds.
#[doc(hidden)]
pub struct VarHold(NonNull<VarCore>);

// SAFETY: a `VarHold` is an `Arc<VarInner<T>>` with `T: Send + Sync` (see
// `AnyVar::hold`), which is `Send + Sync`.
unsafe impl Send for VarHold {}
// SAFETY: as above.
unsafe impl Sync for VarHold {}

impl VarHold {
    #[inline]
    pub(crate) fn core(&self) -> &VarCore {
        // SAFETY: we own a strong reference, so the allocation is alive.
        unsafe { self.0.as_ref() }
    }

    /// The value of the variable, given its type.
    ///
    /// # Safety
    ///
    /// `T` is the variable's value type.
    #[inline]
    pub(crate) unsafe fn value<T>(&self) -> &std::cell::UnsafeCell<Option<T>> {
        // SAFETY: the caller guarantees the type; the allocation is alive.
        unsafe { &(*self.0.as_ptr().cast::<VarInner<T>>()).value }
    }
}

impl fmt::Debug for VarHold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VarHold({})", self.id)
    }
}

impl std::ops::Deref for VarHold {
    type Target = VarCore;
    fn deref(&self) -> &VarCore {
        self.core()
    }
}

impl Drop for VarHold {
    fn drop(&mut self) {
        // SAFETY: the core's `release` matches the allocation's value type,
        // and this hold owns one strong reference.
        unsafe { (self.core().release)(self.0) }
    }
}

/// A handle to a variable; clones refer to the same variable.
///
/// `Var<()>`, from [`Engine::new_var`](crate::Engine::new_var), is a plain
/// tag. `Var<T>`, from [`Engine::var`](crate::Engine::var), also owns a `T`
/// that ops reach through [`OpCtx::read`](crate::OpCtx::read) and
/// [`OpCtx::write`](crate::OpCtx::write).
///
/// ```
/// let engine = depflow::Engine::new();
/// let rng_state = engine.new_var(); // a tag for something held elsewhere
/// let weights = engine.var(vec![0.5f32; 4]); // a variable owning its value
/// assert_eq!(weights.version(), 0);
/// assert_ne!(rng_state.id(), weights.id());
/// ```
///
/// **Dropping the last handle.** A variable lives while a handle to it, an
/// op pushed on it that has not retired, or a recorded [`Graph`] that
/// uses it is left. Drop the last handle while ops on it are pending, and
/// they still run on it; its value is dropped (with the units it holds,
/// [`OpBuilder::allocates`]) when the last of them retires, on the thread
/// that retires it, before that op's handle resolves; with none pending
/// (and no graph), at once. (Except a value a stream device's op touched:
/// dropped on a thread that does not keep that device's context current,
/// it goes to the device's poller, and is dropped there soon after: see
/// [`Stream::cuda`](crate::Stream).) Nothing leaks, and no
/// [`delete_var`](crate::Engine::delete_var) is needed. (A value whose
/// drop panics there is reported by [`wait_all`](crate::Engine::wait_all)
/// as a failure of that op.)
///
/// ```
/// use std::sync::mpsc;
///
/// /// Says when it is dropped.
/// struct Tell(mpsc::Sender<&'static str>);
/// impl Drop for Tell {
///     fn drop(&mut self) {
///         self.0.send("value dropped").unwrap();
///     }
/// }
///
/// let engine = depflow::Engine::new();
/// let (tx, said) = mpsc::channel();
/// let v = engine.var(Tell(tx.clone()));
/// let (open, gate) = mpsc::channel::<()>();
/// let k = v.key();
/// let op = engine.op().mutates(&[&v]).run(move |ctx| {
///     gate.recv().unwrap(); // still pending when the handle goes
///     let _value = ctx.write(k)?;
///     tx.send("op ran").unwrap();
///     Ok(())
/// })?;
/// drop(v); // the last handle: the value stays for the op
/// assert!(said.try_recv().is_err());
/// open.send(()).unwrap();
/// op.wait()?; // it retired: the value went with it
/// assert_eq!(said.try_iter().collect::<Vec<_>>(), ["op ran", "value dropped"]);
///
/// // With no op pending, the value goes with the handle.
/// let (tx, said) = mpsc::channel();
/// drop(engine.var(Tell(tx)));
/// assert_eq!(said.try_recv(), Ok("value dropped"));
/// # Ok::<(), depflow::Error>(())
/// ```
///
/// [`Graph`]: crate::Graph
/// [`OpBuilder::allocates`]: crate::OpBuilder::allocates
pub struct Var<T = ()> {
    inner: Arc<VarInner<T>>,
}

impl<T: Send + Sync + 'static> Var<T> {
    pub(crate) fn new(engine: u64, value: T) -> Self {
        Self::with_name(engine, value, None, 0)
    }

    /// An intermediate of the recorded graph `graph` (not 0): only that
    /// graph's ops may declare it.
    pub(crate) fn intermediate(engine: u64, value: T, graph: u64, name: Option<Arc<str>>) -> Self {
        debug_assert_ne!(graph, 0);
        Self::with_name(engine, value, name, graph)
    }

    /// A variable whose id prints as `name` while it is alive (see
    /// `error::names`).
    pub(crate) fn named(engine: u64, value: T, name: Arc<str>) -> Self {
        Self::with_name(engine, value, Some(name), 0)
    }

    fn with_name(engine: u64, value: T, name: Option<Arc<str>>, graph: u64) -> Self {
        let id = VarId(NEXT_VAR_ID.fetch_add(1, Ordering::Relaxed));
        let named = name.is_some();
        if let Some(name) = name {
            names::register(id, name);
        }
        let core = VarCore {
            engine,
            id,
            graph,
            release: release::<T>,
            take_value: take_value::<T>,
            deleted: AtomicBool::new(false),
            named,
            value_drops: std::mem::needs_drop::<T>(),
            chain: Chain::new(Written {
                version: AtomicU64::new(0),
                state: UnsafeCell::new(VarState::Live),
                held: UnsafeCell::new(Held::new(id)),
                fences: VarFences::default(),
                device: DeviceOf::default(),
            }),
        };
        Self {
            inner: Arc::new(VarInner {
                core,
                value: std::cell::UnsafeCell::new(Some(value)),
            }),
        }
    }
}

impl<T> Var<T> {
    /// The variable's identity.
    pub fn id(&self) -> VarId {
        self.inner.core.id
    }

    /// How many mutations of this variable have completed (successful, failed
    /// or skipped alike): it grows by one with each.
    ///
    /// A mutation counts when its op hands the variable on to the next ops:
    /// on the host, when the op completes; on a stream device, as soon as
    /// its body has enqueued its device work, *before that work is done*
    /// (the next ops on the variable are ordered after it all the same: on
    /// the device by the stream, on the host by waiting for it). To know
    /// the device work is done as well, wait for the op's handle or for the
    /// variable ([`Engine::wait_for_var`](crate::Engine::wait_for_var)).
    pub fn version(&self) -> u64 {
        self.inner.core.version()
    }

    /// A `Copy` key to this variable, for op closures: it lets a closure reach
    /// the variable's value through its [`OpCtx`](crate::OpCtx) without
    /// owning a handle (no reference counting on the hot path).
    ///
    /// ```
    /// let engine = depflow::Engine::new();
    /// let counter = engine.var(0u64);
    /// let key = counter.key();
    /// for _ in 0..3 {
    ///     engine.push(&[], &[&counter], move |ctx| {
    ///         *ctx.write(key)? += 1;
    ///         Ok(())
    ///     })?;
    /// }
    /// engine.wait_for_var(&counter).wait()?;
    /// assert_eq!(counter.version(), 3);
    /// # Ok::<(), depflow::Error>(())
    /// ```
    #[inline]
    pub fn key(&self) -> VarKey<T> {
        VarKey {
            id: self.inner.core.id,
            _value: PhantomData,
        }
    }

    pub(crate) fn core(&self) -> &VarCore {
        &self.inner.core
    }
}

impl<T> Clone for Var<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
        }
    }
}

impl<T> PartialEq for Var<T> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }
}

impl<T> Eq for Var<T> {}

impl<T> std::hash::Hash for Var<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id().hash(state)
    }
}

impl<T> fmt::Debug for Var<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Var")
            .field("id", &self.id())
            .field("version", &self.version())
            .finish()
    }
}

/// A `Copy` key to a variable, from [`Var::key`]: what an op closure can
/// capture instead of a [`Var`] to reach the value through its
/// [`OpCtx`](crate::OpCtx).
///
/// A key owns nothing: it only names the variable, by its id (unique in the
/// process). An op can use it only for a variable it declared (and therefore
/// holds), so a key outliving its variable is harmless: using it gives
/// [`Error::NotDeclared`](crate::Error::NotDeclared).
///
/// ```
/// use depflow::{Engine, Error};
///
/// let engine = Engine::new();
/// let (a, b) = (engine.var(1), engine.var(2));
/// let (ka, kb) = (a.key(), b.key());
/// let r = engine.push(&[&a], &[], move |ctx| {
///     assert_eq!(*ctx.read(ka)?, 1);
///     assert!(matches!(ctx.read(kb), Err(Error::NotDeclared(_)))); // b not declared
///     Ok(())
/// })?;
/// r.wait()?;
/// # Ok::<(), Error>(())
/// ```
pub struct VarKey<T> {
    id: VarId,
    _value: PhantomData<fn() -> T>,
}

impl<T> VarKey<T> {
    /// The variable's identity.
    pub fn id(&self) -> VarId {
        self.id
    }

    /// Whether `hold` is the variable this key names.
    #[inline]
    pub(crate) fn names(&self, hold: &VarHold) -> bool {
        // Ids are never reused, and a key is made only from a `Var<T>`: a
        // match means the same variable, hence the same `T`.
        hold.id == self.id
    }
}

impl<T> Clone for VarKey<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for VarKey<T> {}

impl<T> fmt::Debug for VarKey<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VarKey({})", self.id)
    }
}

impl<T> From<&Var<T>> for VarKey<T> {
    fn from(var: &Var<T>) -> Self {
        var.key()
    }
}

pub(super) mod sealed {
    pub trait Sealed {}
}

/// Any variable, whatever the type of its value: what op declarations take.
///
/// `&[&a, &b]` coerces to `&[&dyn AnyVar]` even when `a` and `b` hold values
/// of different types. Implemented by [`Var<T>`] only.
///
/// ```
/// use depflow::{AnyVar, Engine, Error};
///
/// let engine = Engine::new();
/// let (tensor, step, tag) = (engine.var(vec![0f32; 16]), engine.var(0u64), engine.new_var());
/// let inputs: &[&dyn AnyVar] = &[&tensor, &step];
/// engine.push(inputs, &[&tag], |_| Ok(()))?;
/// # Ok::<(), Error>(())
/// ```
pub trait AnyVar: sealed::Sealed + Send + Sync {
    #[doc(hidden)]
    fn core(&self) -> &VarCore;

    /// A strong reference to the variable, for an op's edge.
    #[doc(hidden)]
    fn hold(&self) -> VarHold;

    /// An owned handle to the variable (a recorded graph keeps its
    /// boundary's).
    #[doc(hidden)]
    fn to_owned_var(&self) -> Box<dyn AnyVar>;
}

impl<T> sealed::Sealed for Var<T> {}

impl<T: Send + Sync + 'static> AnyVar for Var<T> {
    #[inline]
    fn core(&self) -> &VarCore {
        &self.inner.core
    }

    #[inline]
    fn hold(&self) -> VarHold {
        let ptr = Arc::into_raw(self.inner.clone())
            .cast::<VarCore>()
            .cast_mut();
        // SAFETY: `Arc::into_raw` never returns null.
        VarHold(unsafe { NonNull::new_unchecked(ptr) })
    }

    fn to_owned_var(&self) -> Box<dyn AnyVar> {
        Box::new(self.clone())
    }
}

impl fmt::Debug for dyn AnyVar + '_ {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.core().id)
    }
}

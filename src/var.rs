//! Variables: the tags that ops declare, and the values they may own.
//!
//! A [`Var<T>`] is a handle to one variable. `Var<()>` (what
//! [`Engine::new_var`](crate::Engine::new_var) returns) is the seed's plain
//! tag: it stands for a resource the engine does not own (device memory, a
//! file, an RNG held elsewhere). `Var<T>` for another `T` owns a value that
//! ops reach through their [`OpCtx`](crate::OpCtx): `&T` for an op that
//! declared the variable as read, `&mut T` for one that declared it mutated.
//!
//! The engine-side state of a variable, [`VarCore`], holds its dependency
//! chain, its version and its state (live, poisoned or deleted). The state
//! and the value are plain cells: the chain's grants are what make access to
//! them exclusive (a granted write) or shared (granted reads), so they need no
//! lock of their own.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::chain::Chain;
use crate::error::OpFailure;
use crate::op::OpBlock;
use crate::sync::UnsafeCell;

/// A variable's identity, unique within its engine; used in errors.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VarId(pub(crate) u64);

impl fmt::Display for VarId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "var#{}", self.0)
    }
}

impl fmt::Debug for VarId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// What a variable holds, as seen by the op that holds a grant on it.
#[derive(Clone, Debug)]
pub(crate) enum VarState {
    Live,
    Poisoned(Arc<OpFailure>),
    Deleted,
}

/// The engine-side state of one variable. Not nameable outside the crate.
#[doc(hidden)]
pub struct VarCore {
    pub(crate) chain: Chain<OpBlock>,
    version: AtomicU64,
    /// Read by ops holding a grant, written by ops holding a write grant.
    state: UnsafeCell<VarState>,
    /// A delete has been pushed: later pushes are refused.
    deleted: AtomicBool,
    engine: u64,
    id: VarId,
}

// SAFETY: `state` is accessed only by ops holding a grant on this variable:
// shared reads under read grants, exclusive writes under the write grant
// (see `state`/`set_state`); the chain orders grants with release/acquire
// hand-offs. All other fields are atomic or immutable.
unsafe impl Sync for VarCore {}
// SAFETY: as above; `VarState` is `Send`.
unsafe impl Send for VarCore {}

impl VarCore {
    pub(crate) fn new(engine: u64, id: u64) -> Self {
        Self {
            chain: Chain::default(),
            version: AtomicU64::new(0),
            state: UnsafeCell::new(VarState::Live),
            deleted: AtomicBool::new(false),
            engine,
            id: VarId(id),
        }
    }

    pub(crate) fn id(&self) -> VarId {
        self.id
    }

    pub(crate) fn engine(&self) -> u64 {
        self.engine
    }

    pub(crate) fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// Counts one completed mutation; called by the op holding the write grant.
    pub(crate) fn bump_version(&self) {
        self.version.fetch_add(1, Ordering::Release);
    }

    pub(crate) fn is_deleted(&self) -> bool {
        self.deleted.load(Ordering::Acquire)
    }

    /// Marks a delete as pushed. Returns `false` if one already was.
    pub(crate) fn mark_deleted(&self) -> bool {
        !self.deleted.swap(true, Ordering::AcqRel)
    }

    /// The variable's state.
    ///
    /// # Safety
    ///
    /// The calling op holds a granted edge (read or write) on this variable.
    pub(crate) unsafe fn state(&self) -> VarState {
        // SAFETY: a grant excludes writers, and writers are the only ones that
        // modify the state.
        self.state.with(|s| unsafe { (*s).clone() })
    }

    /// Replaces the variable's state.
    ///
    /// # Safety
    ///
    /// The calling op holds the granted write edge on this variable.
    pub(crate) unsafe fn set_state(&self, state: VarState) {
        // SAFETY: a granted write is exclusive.
        self.state.with_mut(|s| unsafe { *s = state });
    }
}

impl Drop for VarCore {
    fn drop(&mut self) {
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

/// The value a typed variable owns.
pub(crate) struct Value<T>(std::cell::UnsafeCell<Option<T>>);

// SAFETY: the value is shared across threads only under the chain's grants:
// shared references for concurrent readers (needs `T: Sync`), a unique one for
// the single writer, which may run on any thread (needs `T: Send`).
unsafe impl<T: Send + Sync> Sync for Value<T> {}

impl<T> Value<T> {
    /// # Safety
    ///
    /// The calling op holds a granted edge on the variable and no mutable
    /// reference to the value is alive.
    pub(crate) unsafe fn get(&self) -> Option<&T> {
        // SAFETY: forwarded to the caller.
        unsafe { (*self.0.get()).as_ref() }
    }

    /// # Safety
    ///
    /// The calling op holds the granted write edge on the variable and no
    /// other reference to the value is alive.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn get_mut(&self) -> Option<&mut T> {
        // SAFETY: forwarded to the caller.
        unsafe { (*self.0.get()).as_mut() }
    }

    /// # Safety
    ///
    /// As for [`get_mut`](Self::get_mut).
    pub(crate) unsafe fn take(&self) -> Option<T> {
        // SAFETY: forwarded to the caller.
        unsafe { (*self.0.get()).take() }
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
pub struct Var<T = ()> {
    core: Arc<VarCore>,
    value: Arc<Value<T>>,
}

impl<T> Var<T> {
    pub(crate) fn new(core: VarCore, value: T) -> Self {
        Self {
            core: Arc::new(core),
            value: Arc::new(Value(std::cell::UnsafeCell::new(Some(value)))),
        }
    }

    /// The variable's identity.
    pub fn id(&self) -> VarId {
        self.core.id
    }

    /// How many mutations of this variable have completed (successful, failed
    /// or skipped alike): it grows by one with each.
    pub fn version(&self) -> u64 {
        self.core.version()
    }

    pub(crate) fn value(&self) -> &Value<T> {
        &self.value
    }
}

impl<T> Clone for Var<T> {
    fn clone(&self) -> Self {
        Self {
            core: self.core.clone(),
            value: self.value.clone(),
        }
    }
}

impl<T> PartialEq for Var<T> {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.core, &other.core)
    }
}

impl<T> Eq for Var<T> {}

impl<T> std::hash::Hash for Var<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (Arc::as_ptr(&self.core) as usize).hash(state)
    }
}

impl<T> fmt::Debug for Var<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Var")
            .field("id", &self.core.id)
            .field("version", &self.core.version())
            .finish()
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Any variable, whatever the type of its value: what op declarations take.
///
/// `&[&a, &b]` coerces to `&[&dyn AnyVar]` even when `a` and `b` hold values
/// of different types. Implemented by [`Var<T>`] only.
pub trait AnyVar: sealed::Sealed + Send + Sync {
    #[doc(hidden)]
    fn core(&self) -> &Arc<VarCore>;
}

impl<T> sealed::Sealed for Var<T> {}

impl<T: Send + Sync> AnyVar for Var<T> {
    fn core(&self) -> &Arc<VarCore> {
        &self.core
    }
}

impl fmt::Debug for dyn AnyVar + '_ {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.core().id)
    }
}

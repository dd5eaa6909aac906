//! The names of named variables, for messages: a process-wide map from a
//! [`VarId`] to its name, which [`VarId`]'s `Display` consults.
//!
//! Only named variables are in it: a variable made with a name registers it
//! at creation and removes it when it is freed (its core's `Drop`), and an
//! unnamed variable never touches the map. So the ids that errors and
//! reports carry stay plain `Copy` numbers, pushes and runs never look a name
//! up, and a name shows while its variable is alive: an error printed after
//! the variable was freed shows `var#N` only.
//!
//! The map sits behind a plain lock, taken to name, to free a named
//! variable, and to print an id while any named variable is alive: all cold.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::VarId;

/// Names by id.
static NAMES: Mutex<Option<HashMap<u64, Arc<str>>>> = Mutex::new(None);

/// How many names `NAMES` holds: printing an id skips the lock while none.
static COUNT: AtomicUsize = AtomicUsize::new(0);

fn names() -> MutexGuard<'static, Option<HashMap<u64, Arc<str>>>> {
    // Nothing panics under the lock but an allocation failure; the map is
    // consistent whatever happened.
    NAMES.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Names `id` (a new variable, not yet shared).
pub(crate) fn register(id: VarId, name: Arc<str>) {
    let mut names = names();
    if names
        .get_or_insert_with(HashMap::new)
        .insert(id.0, name)
        .is_none()
    {
        COUNT.fetch_add(1, Ordering::Release);
    }
}

/// Forgets the name of `id` (its variable is being freed).
pub(crate) fn unregister(id: VarId) {
    let mut names = names();
    if names.as_mut().and_then(|n| n.remove(&id.0)).is_some() {
        COUNT.fetch_sub(1, Ordering::Release);
    }
}

/// The name of `id`, if its variable was named and is alive.
pub(crate) fn lookup(id: VarId) -> Option<Arc<str>> {
    if COUNT.load(Ordering::Acquire) == 0 {
        return None;
    }
    names().as_ref()?.get(&id.0).cloned()
}

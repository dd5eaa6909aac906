//! A no-op host, to drive the real ops without an engine (tokio's
//! `NoopSchedule`): the loom models in `loom-tests/` and this layer's own
//! tests push ops through [`Harness`], and run what it dispatched on threads
//! of their choosing. Everything an op does, it does as in the engine:
//! the same blocks, chains, countdowns, anchors, lifecycle, poison and
//! reclamation lists; only the host is a stand-in, and it records what the
//! ops told it.

// Not every part serves both the loom models and the unit tests.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;

use super::block::{Mode, OpBlock, OpSpec, Runner};
use super::body::{AsyncBody, Body, SyncBody};
use super::ctx::OpCtx;
use super::decl::edges;
use super::host::{Host, new_host_id};
use super::own::{deletion, mark_deleted};
use super::reclaim;
use super::spawn::{OpTask, spawn};
use super::units::OpUnits;
use super::var::{AnyVar, Var};
use crate::core::tickets::Broker;
use crate::device::StreamDevice;
use crate::error::{BoxError, Error, OpFailure};
use crate::loom::sync::atomic::{AtomicUsize, Ordering::*};
use crate::loom::sync::{Condvar, Mutex};
use crate::resource::Resource;

/// A lifecycle hook, as the no-op host records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// `Host::on_pushed`.
    Pushed,
    /// `Host::on_ready`.
    Ready,
    /// `Host::on_granted`.
    Granted,
    /// `Host::on_started`.
    Started,
    /// `Host::on_ended`.
    Ended,
}

/// The no-op host: dispatched ops wait in a queue for the model to run
/// them; failures and retirements are counted; hooks are recorded.
#[derive(Debug)]
pub(crate) struct NoopHost {
    id: u64,
    push_lock: Mutex<()>,
    ready: Mutex<VecDeque<Runner>>,
    dispatched: Condvar,
    broker: Broker<Runner>,
    failures: Mutex<Vec<Arc<OpFailure>>>,
    retired: AtomicUsize,
    hooks: Mutex<Vec<(String, Hook)>>,
    /// Each op made ready, with the op whose completion did it (by name).
    granters: Mutex<Vec<(String, Option<String>)>>,
}

impl NoopHost {
    fn hook(&self, op: &OpBlock, hook: Hook) {
        let name = op.name().unwrap_or("").to_string();
        self.hooks.lock().push((name, hook));
    }
}

impl Host for NoopHost {
    fn id(&self) -> u64 {
        self.id
    }

    fn push_lock(&self) -> &Mutex<()> {
        &self.push_lock
    }

    fn has_streams(&self) -> bool {
        false
    }

    fn stream_device(&self, _device_index: u16) -> Option<&StreamDevice> {
        None
    }

    fn dispatch(&self, op: Runner, _yielded: bool) {
        self.ready.lock().push_back(op);
        self.dispatched.notify_all();
    }

    fn wanted(&self, _device_index: u16) -> usize {
        usize::MAX // no workers: dispatched ops wait in `ready`
    }

    fn broker(&self) -> &Broker<Runner> {
        &self.broker
    }

    fn record_failure(&self, failure: Arc<OpFailure>) {
        self.failures.lock().push(failure);
    }

    fn retire(&self, _op: &OpBlock) {
        self.retired.fetch_add(1, AcqRel);
    }

    fn on_pushed(&self, op: &OpBlock) {
        self.hook(op, Hook::Pushed);
    }

    fn on_ready(&self, op: &OpBlock, by: Option<&OpBlock>) {
        self.hook(op, Hook::Ready);
        let name = |op: &OpBlock| op.name().unwrap_or("").to_string();
        self.granters.lock().push((name(op), by.map(name)));
    }

    fn on_granted(&self, op: &OpBlock, _by: super::host::Units<'_>) {
        self.hook(op, Hook::Granted);
    }

    fn on_started(&self, op: &OpBlock) {
        self.hook(op, Hook::Started);
    }

    fn on_ended(&self, op: &OpBlock) {
        self.hook(op, Hook::Ended);
    }
}

/// Pushes real ops to a no-op host and runs what it dispatches. Cheap to
/// clone; the clones share the host, which must outlive every op pushed
/// (keep one clone until they all retired).
#[derive(Clone, Debug)]
pub struct Harness {
    host: Arc<NoopHost>,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

/// A pushed op's task: its result, once it ran.
#[derive(Debug)]
pub struct Handle<T>(OpTask<T>);

impl<T> Handle<T> {
    /// Whether the op has finished.
    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }

    /// Blocks until the op finished (another thread must run it) and
    /// returns its result.
    pub fn wait(self) -> Result<T, Error> {
        #[cfg(loom)]
        let output = loom::future::block_on(self.0);
        #[cfg(not(loom))]
        let output = futures::executor::block_on(self.0);
        output.map(super::output::Output::into_inner)
    }

    /// Asks the op not to run, if it has not started; whether its body will
    /// not run (`OpHandle::cancel`).
    pub fn cancel(&self) -> bool {
        self.0.metadata().cancel() == super::start::Cancel::NotRun
    }

    /// Whether the op's body started (`OpHandle::is_started`).
    pub fn is_started(&self) -> bool {
        self.0.metadata().is_started()
    }

    /// Lets the op run to the end without anyone waiting for it.
    pub fn detach(self) {
        self.0.detach();
    }
}

impl crate::resource::Ledger for NoopHost {
    fn free(&self, pool: usize) -> u64 {
        self.broker.units(pool).1
    }

    fn give_back(&self, pool: usize, amount: u64) {
        self.give_back_units(&[(pool, amount)], super::host::Units::Var);
    }
}

impl Harness {
    /// A resource of `capacity` units, accounted in this host's broker.
    pub fn resource(&self, name: &'static str, capacity: u64) -> Resource {
        let pool = self.host.broker.add_pool(name, capacity);
        Resource::new(self.host.id, pool, name.into(), capacity, self.host.clone())
    }

    /// Pushes an op with a synchronous body that uses `amount` units of
    /// `resource` while it runs (`OpBuilder::uses`).
    pub fn push_using<F, T>(
        &self,
        name: &'static str,
        mutates: &[&dyn AnyVar],
        resource: &Resource,
        amount: u64,
        f: F,
    ) -> Result<Handle<T>, Error>
    where
        F: FnOnce(&OpCtx) -> Result<T, BoxError> + Send + 'static,
        T: Send + 'static,
    {
        let mut spec = OpSpec::own(edges(&[], mutates, self.host.id)?, name, Mode::Normal);
        let mut units = OpUnits::default();
        units.add(resource, amount, None);
        spec.units = Some(Box::new(units));
        Ok(Handle(spawn(spec, SyncBody(Some(f)), &*self.host)))
    }

    /// How many ops wait in the broker for their units.
    pub fn waiting_for_units(&self) -> usize {
        let mut waiting = 0;
        self.host.broker.for_each_waiting(|_| waiting += 1);
        waiting
    }

    /// A harness over a new no-op host.
    pub fn new() -> Self {
        Self {
            host: Arc::new(NoopHost {
                id: new_host_id(),
                push_lock: Mutex::new(()),
                ready: Mutex::new(VecDeque::new()),
                dispatched: Condvar::default(),
                broker: Broker::default(),
                failures: Mutex::new(Vec::new()),
                retired: AtomicUsize::new(0),
                hooks: Mutex::new(Vec::new()),
                granters: Mutex::new(Vec::new()),
            }),
        }
    }

    /// The no-op host (a recorded graph's runtime runs on it).
    pub(crate) fn host(&self) -> &Arc<NoopHost> {
        &self.host
    }

    /// Pushes an op made of `spec` and `body`.
    pub(crate) fn push_spec<B: Body>(&self, spec: OpSpec, body: B) -> Handle<B::Output> {
        Handle(spawn(spec, body, &*self.host))
    }

    /// A variable of this host owning `value`.
    pub fn var<T: Send + Sync + 'static>(&self, value: T) -> Var<T> {
        Var::new(self.host.id, value)
    }

    fn push_body<B: Body>(
        &self,
        name: &'static str,
        reads: &[&dyn AnyVar],
        mutates: &[&dyn AnyVar],
        mode: Mode,
        body: B,
    ) -> Result<Handle<B::Output>, Error> {
        let spec = OpSpec::own(edges(reads, mutates, self.host.id)?, name, mode);
        Ok(Handle(spawn(spec, body, &*self.host)))
    }

    /// Pushes an op with a synchronous body, as `Engine::push` does.
    pub fn push<F, T>(
        &self,
        name: &'static str,
        reads: &[&dyn AnyVar],
        mutates: &[&dyn AnyVar],
        f: F,
    ) -> Result<Handle<T>, Error>
    where
        F: FnOnce(&OpCtx) -> Result<T, BoxError> + Send + 'static,
        T: Send + 'static,
    {
        self.push_body(name, reads, mutates, Mode::Normal, SyncBody(Some(f)))
    }

    /// Pushes an op with an asynchronous body, as `Engine::push_async` does.
    pub fn push_async<F, Fut, T>(
        &self,
        name: &'static str,
        reads: &[&dyn AnyVar],
        mutates: &[&dyn AnyVar],
        f: F,
    ) -> Result<Handle<T>, Error>
    where
        F: FnOnce(OpCtx) -> Fut + Send + 'static,
        Fut: Future<Output = Result<T, BoxError>> + Send + 'static,
        T: Send + 'static,
    {
        self.push_body(name, reads, mutates, Mode::Normal, AsyncBody::new(f))
    }

    /// Deletes `var` after the ops pushed on it, as `Engine::delete_var`
    /// does: `f` gets its value.
    pub fn delete<T: Send + Sync + 'static>(
        &self,
        var: &Var<T>,
        f: impl FnOnce(T) + Send + 'static,
    ) -> Result<Handle<()>, Error> {
        let (spec, body) = deletion(var, self.host.id, f)?;
        // No admission to refuse it here: marked at once, as the engine
        // does once it admitted the delete.
        mark_deleted(var)?;
        Ok(Handle(spawn(spec, body, &*self.host)))
    }

    /// Runs one dispatched op (one poll of it), if there is one.
    pub fn run_one(&self) -> bool {
        let next = self.host.ready.lock().pop_front();
        match next {
            Some(op) => {
                op.run();
                true
            }
            None => false,
        }
    }

    /// Waits until an op is dispatched and runs it (one poll).
    pub fn run_next(&self) {
        let op = {
            let mut ready = self.host.ready.lock();
            loop {
                if let Some(op) = ready.pop_front() {
                    break op;
                }
                ready = self.host.dispatched.wait(ready);
            }
        };
        op.run();
    }

    /// Ops retired so far.
    pub fn retired(&self) -> usize {
        self.host.retired.load(Acquire)
    }

    /// Failures recorded so far, by op name.
    pub fn failures(&self) -> Vec<Option<String>> {
        let failures = self.host.failures.lock();
        failures
            .iter()
            .map(|f| f.op_name().map(str::to_owned))
            .collect()
    }

    /// The hooks called so far, in order, by op name.
    pub fn hooks(&self) -> Vec<(String, Hook)> {
        self.host.hooks.lock().clone()
    }

    /// Every op made ready so far, with the op whose completion made it
    /// ready (`None`: ready at its push), as `Host::on_ready` was told.
    pub fn granters(&self) -> Vec<(String, Option<String>)> {
        self.host.granters.lock().clone()
    }
}

/// Frees the finished ops the calling thread pushed (its reclamation list's
/// head, as a push or a wait does).
pub fn reclaim_finished() {
    reclaim::collect();
}

/// What the calling thread's exit does to the ops it pushed and did not free
/// yet: frees the finished, orphans the others (their last releaser frees
/// them). A model calls it before its thread ends: loom does not order a
/// thread-local's destructor before `join`.
pub fn exit_thread() {
    reclaim::orphan_all();
}

/// Whether the calling thread still has ops it pushed and did not free.
pub fn holds_pushed_ops() -> bool {
    reclaim::has_adopted()
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// An op with no dependency calls its hooks in order; one behind it
    /// becomes ready only when the first finishes.
    #[test]
    fn hooks_follow_the_lifecycle() {
        let h = Harness::new();
        let v = h.var(0u64);
        let k = v.key();
        let first = h
            .push("first", &[], &[&v], move |ctx| {
                *ctx.write(k)? += 1;
                Ok(1)
            })
            .unwrap();
        let second = h
            .push("second", &[&v], &[], move |ctx| Ok(*ctx.read(k)?))
            .unwrap();
        use Hook::*;
        let of = |name: &str| -> Vec<Hook> {
            h.hooks()
                .into_iter()
                .filter(|(n, _)| n == name)
                .map(|(_, hook)| hook)
                .collect()
        };
        assert_eq!(of("first"), [Pushed, Ready]);
        assert_eq!(of("second"), [Pushed]);
        assert!(h.run_one());
        assert_eq!(of("first"), [Pushed, Ready, Started, Ended]);
        assert_eq!(of("second"), [Pushed, Ready]);
        assert!(h.run_one());
        assert!(!h.run_one());
        assert_eq!((first.wait().unwrap(), second.wait().unwrap()), (1, 1));
        assert_eq!(h.retired(), 2);
        reclaim_finished();
        assert!(!holds_pushed_ops());
    }

    /// `on_ready` names the op whose completion gave the last grant: the
    /// writer for its readers, the last reader for the next writer, none
    /// for an op ready at its push.
    #[test]
    fn the_completing_op_is_the_granter() {
        let h = Harness::new();
        let (v, w) = (h.var(0u8), h.var(0u8));
        let handles = [
            h.push("write", &[], &[&v], |_| Ok(())).unwrap(),
            h.push("read", &[&v], &[], |_| Ok(())).unwrap(),
            h.push("both", &[&v], &[&w], |_| Ok(())).unwrap(),
            h.push("rewrite", &[], &[&v], |_| Ok(())).unwrap(),
        ];
        while h.run_one() {}
        for handle in handles {
            handle.wait().unwrap();
        }
        let granters = h.granters();
        let by = |name: &str| {
            granters
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, by)| by.as_deref())
                .unwrap()
        };
        assert_eq!(by("write"), None);
        assert_eq!(by("read"), Some("write"));
        assert_eq!(by("both"), Some("write"));
        // The two readers run in order here: the second one to complete
        // lets the writer through.
        assert_eq!(by("rewrite"), Some("both"));
        reclaim_finished();
    }

    /// A failing op poisons what it mutates; the op behind it is skipped
    /// (its body never runs) and passes the poison on.
    #[test]
    fn failures_poison_in_order() {
        let h = Harness::new();
        let (a, b) = (h.var(0u8), h.var(0u8));
        let failed = h
            .push("load", &[], &[&a], |_| Err::<(), _>("disk full".into()))
            .unwrap();
        let skipped = h
            .push("use", &[&a], &[&b], |_| -> Result<(), BoxError> {
                panic!("a skipped op's body ran")
            })
            .unwrap();
        while h.run_one() {}
        assert!(matches!(failed.wait(), Err(Error::Failed(_))));
        match skipped.wait() {
            Err(Error::Poisoned { cause, .. }) => assert_eq!(cause.op_name(), Some("load")),
            other => panic!("{other:?}"),
        }
        assert_eq!(h.failures(), [Some("load".to_string())]);
        assert_eq!(h.retired(), 2);
        reclaim_finished();
    }
}

//! The dependency layer: variables, the ops declared on them, and every
//! step of an op's life from push to retirement.
//!
//! | module | owns |
//! | --- | --- |
//! | `var` | variables: their chain, version, state (live, poisoned, deleted), held units, fences and value |
//! | `block` | one op's metadata, the [`OpBlock`], and its edges |
//! | `decl` | declarations normalised into edges |
//! | `spawn` | pushing an op: its task, and linking it into its variables' chains |
//! | `lifecycle` | grant, ready, finish, skip, retire: the transitions, generic over the host |
//! | `units` | the counted units an op needs, and how lasting ones are handed on |
//! | `poison` | whether an op may run, and how failures pass on |
//! | `start` | whether its body runs: the start and a cancel, decided by one read-modify-write each |
//! | `body`, `future`, `stream_op` | what an op runs, and the futures that run it (host and stream devices) |
//! | `output` | an op's result as its task keeps it, and failures of values dropped after their op retired |
//! | `ctx` | what a body sees: [`OpCtx`], and what it reaches through it: variables, keys and planned buffers alike ([`Operand`]) |
//! | `own` | the host's own ops: delete, clear poison, wait for a variable |
//! | `task` | the pusher's side of an op's task: await, ask, cancel |
//! | `reclaim` | who frees an op's memory: the thread that pushed it |
//! | `host` | what the layer needs from above: the [`Host`] trait |
//! | `resident` | a recorded graph's ops: their resident tasks, and one run of such an op |
//! | `buffer` | planned buffers ([`Buffer`]) and the arena a graph's buffers share |
//! | `device_buffer` | planned device buffers ([`DeviceBuffer`]): one arena of device memory per device per graph, and a body's views of it |
//!
//! May import: `crate::loom`, `crate::core`, `crate::error`,
//! `crate::resource`, `crate::device`. It reaches the engine only through
//! [`Host`], which the engine implements (and the loom models, with a no-op
//! host: `testing`). The planned recorded graphs (`graph/`) will build their
//! replays from the same blocks and lifecycle.

mod block;
mod body;
mod buffer;
mod ctx;
mod decl;
mod device_buffer;
mod future;
mod host;
mod lifecycle;
mod output;
mod own;
mod poison;
pub(crate) mod reclaim;
mod resident;
mod resident_stream;
mod resident_units;
mod spawn;
mod start;
mod stream_op;
mod task;
#[cfg(any(test, loom))]
pub(crate) mod testing;
mod units;
mod var;

pub(crate) use self::block::{Mode, OpBlock, OpSpec, Runner};
pub(crate) use self::body::{AsyncBody, Body, SyncBody};
pub(crate) use self::buffer::Arena;
pub(crate) use self::buffer::buffer_bytes;
pub use self::buffer::{Buffer, Element};
pub(crate) use self::ctx::Env;
pub use self::ctx::{Device, OpCtx, Operand, TypedVar, VarMut, VarRef};
pub(crate) use self::decl::edges;
pub(crate) use self::decl::{distinct_edges, recorded_edges};
pub use self::device_buffer::DeviceBuffer;
pub(crate) use self::device_buffer::{DeviceArena, DeviceArenas};
#[cfg(feature = "mpi")]
pub(crate) use self::future::skipped_because;
pub(crate) use self::future::{in_op, in_op_of, with_current_op};
pub(crate) use self::host::{Host, RecordedRun, Units, new_host_id};

pub(crate) use self::output::take_late_failures;
pub(crate) use self::own::{deletion, mark_deleted, unpoisoning, var_wait};
pub(crate) use self::resident::{
    Driver, Ran, RecordedBody, Resident, clear_graph_poison, run_recorded,
};
pub(crate) use self::resident_stream::{
    Enqueue, StreamSlot, clear_graph_fences, complete_recorded, enqueue_recorded, run_captured,
    run_settled,
};
pub(crate) use self::resident_units::{give_back_units, set_tickets};
pub(crate) use self::spawn::{OpTask, spawn};
pub(crate) use self::start::Cancel;
pub(crate) use self::task::PushedOp;
pub(crate) use self::units::{DrawTickets, OpUnits};
pub use self::var::{AnyVar, Var, VarKey};

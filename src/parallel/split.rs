//! Splitting host batches into per-device shards, one batch ahead: the
//! group's inputs, their two slots of shard variables, and the copy ops.
//!
//! Each declared input (a row width) has, per slot and per device, a shard
//! variable. [`Group::load`](super::Group::load) checks a batch, puts it
//! behind an `Arc` and pushes one copy op per device into the next free
//! slot (on a stream device, on its [`Lane::HostToDevice`]); the step
//! reads the oldest loaded slot. Two slots let the next batch's copies run
//! while the current step computes (seed 001's prefetch): the engine orders
//! a copy into a slot after the reads of the step two batches back.
//!
//! Across ranks (`record_failures`), a batch refused on this rank (partial
//! rows, say: the ranks' shares are their own) still takes its place in
//! the line, as a failure: the step that would have stepped on it fails
//! with its error, and so pushes that step's collectives (failed) as the
//! other ranks do, rather than stepping on the next batch or on none
//! (which would pair this rank's collectives with another step's).

use std::collections::VecDeque;
use std::sync::Arc;

use super::group::Member;
use crate::dep::{Var, VarKey};
use crate::device::Lane;
use crate::engine::Engine;
use crate::error::Error;

/// How many batches may be loaded ahead of the steps.
pub(super) const SLOTS: usize = 2;

/// The shard variables of one slot: `shards[d][i]`, input `i` on device `d`.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) shards: Vec<Vec<Var<Vec<f32>>>>,
    keys: Vec<Arc<[VarKey<Vec<f32>>]>>,
    /// Rows per device of the batch loaded last into this slot.
    pub(super) rows: usize,
}

/// A batch in line for a step.
#[derive(Debug)]
enum Loaded {
    /// Its shards are in this slot.
    Slot(usize),
    /// It was refused, for this reason (across ranks only).
    Refused(String),
}

/// The group's inputs and the batches loaded ahead.
#[derive(Debug)]
pub(super) struct Inputs {
    widths: Arc<[usize]>,
    slots: Vec<Slot>,
    /// Batches loaded and not yet stepped on, oldest first (at most
    /// [`SLOTS`], refused ones included).
    loaded: VecDeque<Loaded>,
    next: usize,
    /// Whether a refused batch takes its place in line (a group across
    /// ranks: see the module docs).
    record_failures: bool,
}

impl Inputs {
    pub(super) fn new(
        engine: &Engine,
        widths: Vec<usize>,
        devices: usize,
        record_failures: bool,
    ) -> Self {
        let slots = (0..SLOTS)
            .map(|_| {
                let shards: Vec<Vec<Var<Vec<f32>>>> = (0..devices)
                    .map(|_| widths.iter().map(|_| engine.var(Vec::new())).collect())
                    .collect();
                let keys = shards
                    .iter()
                    .map(|s| s.iter().map(|v| v.key()).collect())
                    .collect();
                Slot {
                    shards,
                    keys,
                    rows: 0,
                }
            })
            .collect();
        Self {
            widths: widths.into(),
            slots,
            loaded: VecDeque::with_capacity(SLOTS),
            next: 0,
            record_failures,
        }
    }

    /// Checks `batch` (one buffer per input, rows of its width) and pushes
    /// its copies into the next slot.
    pub(super) fn load(
        &mut self,
        engine: &Engine,
        members: &[Member],
        batch: Vec<Vec<f32>>,
    ) -> Result<(), Error> {
        if self.loaded.len() == SLOTS {
            return Err(Error::Parallel(format!(
                "{SLOTS} batches already loaded ahead: step before loading another"
            )));
        }
        let rows = match self.rows(&batch, members.len()) {
            Ok(rows) => rows,
            Err(e) => {
                if self.record_failures {
                    self.loaded.push_back(Loaded::Refused(e.to_string()));
                }
                return Err(e);
            }
        };
        let (s, n) = (self.next, members.len());
        let slot = &mut self.slots[s];
        slot.rows = rows / n;
        let batch = Arc::new(batch);
        for (d, m) in members.iter().enumerate() {
            let mut op = engine.op().name("split").on(m.device);
            if m.stream {
                op = op.lane(Lane::HostToDevice);
            }
            for v in &slot.shards[d] {
                op = op.mutates(&[v]);
            }
            let (batch, keys, widths, r) = (
                batch.clone(),
                slot.keys[d].clone(),
                self.widths.clone(),
                slot.rows,
            );
            op.run(move |ctx| {
                for ((input, &key), &w) in batch.iter().zip(keys.iter()).zip(widths.iter()) {
                    let mut shard = ctx.write(key)?;
                    shard.clear();
                    shard.extend_from_slice(&input[d * r * w..(d + 1) * r * w]);
                }
                Ok(())
            })?;
        }
        self.loaded.push_back(Loaded::Slot(s));
        self.next = (s + 1) % SLOTS;
        Ok(())
    }

    /// The rows of a well-formed batch, which split evenly over `n` devices.
    fn rows(&self, batch: &[Vec<f32>], n: usize) -> Result<usize, Error> {
        if batch.len() != self.widths.len() {
            return Err(Error::Parallel(format!(
                "a batch of {} inputs for a group of {}",
                batch.len(),
                self.widths.len()
            )));
        }
        let mut rows = None;
        for (i, (input, &w)) in batch.iter().zip(self.widths.iter()).enumerate() {
            if input.len() % w != 0 {
                return Err(Error::Parallel(format!(
                    "input {i} holds {} floats, not whole rows of {w}",
                    input.len()
                )));
            }
            let r = input.len() / w;
            if rows.is_some_and(|rows| rows != r) {
                return Err(Error::Parallel(format!(
                    "input {i} has {r} rows, input 0 has {}",
                    rows.unwrap_or(0)
                )));
            }
            rows = Some(r);
        }
        let rows = rows.unwrap_or(0);
        if rows == 0 {
            return Err(Error::Parallel("an empty batch".into()));
        }
        if rows % n != 0 {
            return Err(Error::Parallel(format!(
                "a batch of {rows} rows does not split over {n} devices"
            )));
        }
        Ok(rows)
    }

    /// Slot `s`.
    pub(super) fn slot(&self, s: usize) -> &Slot {
        &self.slots[s]
    }

    /// Takes the oldest loaded slot, for a step.
    ///
    /// # Errors
    ///
    /// [`Error::Parallel`] if no batch is loaded, or the oldest was refused
    /// (saying why).
    pub(super) fn take(&mut self) -> Result<usize, Error> {
        if self.widths.is_empty() {
            return Ok(0); // a group without inputs loads nothing
        }
        match self.loaded.pop_front() {
            Some(Loaded::Slot(s)) => Ok(s),
            Some(Loaded::Refused(why)) => Err(Error::Parallel(format!(
                "this step's batch was refused by `load` on this rank ({why})"
            ))),
            None => Err(Error::Parallel(
                "no batch loaded: `load` one before each step".into(),
            )),
        }
    }
}

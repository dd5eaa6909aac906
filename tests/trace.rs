//! Trace timelines: the Chrome trace-event JSON an engine writes, parsed
//! and checked against the program that ran: every op once, its steps in
//! order, flow arrows only along declared dependencies, one track per
//! worker thread and per stream lane, counters; windows, bounded buffers,
//! bad paths.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Barrier};

use common::traced::{held_named_op, traced_engine};
use common::units::allocate;
use common::{gate, within};
use depflow::{Engine, Error, Executor, Lane, Tracing, VarId};
use serde_json::Value;

/// The trace of `engine` as written to a file and parsed back.
fn parsed(engine: &Engine, file: &str) -> Value {
    let path = std::env::temp_dir().join(format!("depflow-test-{}-{file}", std::process::id()));
    engine.trace().unwrap().write_chrome_json(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    serde_json::from_str(&text).expect("the trace is valid JSON")
}

fn events(json: &Value) -> &Vec<Value> {
    json["traceEvents"].as_array().expect("traceEvents")
}

fn of_phase<'a>(json: &'a Value, ph: &'a str) -> impl Iterator<Item = &'a Value> {
    events(json).iter().filter(move |e| e["ph"] == ph)
}

/// Track names by tid.
fn tracks(json: &Value) -> HashMap<u64, String> {
    of_phase(json, "M")
        .filter(|e| e["name"] == "thread_name")
        .map(|e| {
            let name = e["args"]["name"].as_str().unwrap().to_string();
            (e["tid"].as_u64().unwrap(), name)
        })
        .collect()
}

/// One op as its first slice's `args` describe it.
struct Op {
    name: String,
    args: Value,
    tid: u64,
}

impl Op {
    fn at(&self, key: &str) -> Option<f64> {
        self.args[key].as_f64()
    }

    fn vars(&self, key: &str) -> HashSet<u64> {
        self.args[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect()
    }
}

/// Ops by id, from the slices that carry `args` (each op's first; a
/// recorded op's run in a replay is not an op of its own).
fn ops(json: &Value) -> HashMap<u64, Op> {
    let mut ops = HashMap::new();
    for e in of_phase(json, "X").filter(|e| e["args"].is_object() && e["cat"] != "recorded") {
        let id = e["args"]["id"].as_u64().unwrap();
        let op = Op {
            name: e["name"].as_str().unwrap().to_string(),
            args: e["args"].clone(),
            tid: e["tid"].as_u64().unwrap(),
        };
        assert!(ops.insert(id, op).is_none(), "op {id} appears twice");
    }
    ops
}

/// Flow arrows as (from tid, to tid, target op id), checked to pair up.
fn flows(json: &Value) -> Vec<(u64, u64, u64)> {
    let starts: HashMap<u64, &Value> = of_phase(json, "s")
        .map(|e| (e["id"].as_u64().unwrap(), e))
        .collect();
    of_phase(json, "f")
        .map(|f| {
            let id = f["id"].as_u64().unwrap();
            let s = starts.get(&id).expect("a flow's finish has its start");
            assert!(
                s["ts"].as_f64() <= f["ts"].as_f64(),
                "a flow goes forward in time"
            );
            (s["tid"].as_u64().unwrap(), f["tid"].as_u64().unwrap(), id)
        })
        .collect()
}

fn ids(vars: &[&depflow::Var]) -> Vec<u64> {
    vars.iter().map(|v| id_of(v.id())).collect()
}

fn id_of(v: VarId) -> u64 {
    // VarId's Display is `var#N`.
    v.to_string().trim_start_matches("var#").parse().unwrap()
}

/// A program whose dependencies are known: a gate holds the root until
/// every op is pushed (so each op after it waits, and is unblocked by an
/// op that completes), then a chain, a fan-out and a join; two ops meet at a
/// barrier, so that both workers run one.
#[test]
fn the_json_matches_the_program_that_ran() {
    within(60, || {
        let engine = traced_engine(2);
        let (a, b, c, d, e) = (
            engine.new_var(),
            engine.new_var(),
            engine.new_var(),
            engine.new_var(),
            engine.new_var(),
        );
        let open = held_named_op(&engine, "root", &a);
        engine
            .op()
            .name("chain")
            .reads(&[&a])
            .mutates(&[&b])
            .run(|_| Ok(()))
            .unwrap();
        let meet = Arc::new(Barrier::new(2));
        for (name, out) in [("left", &c), ("right", &d)] {
            let meet = meet.clone();
            engine
                .op()
                .name(name)
                .reads(&[&b])
                .mutates(&[out])
                .run(move |_| {
                    meet.wait(); // both run at once: one on each worker
                    Ok(())
                })
                .unwrap();
        }
        engine
            .op()
            .name("join")
            .reads(&[&c, &d])
            .mutates(&[&e])
            .run(|_| Ok(()))
            .unwrap();
        open.send(()).unwrap();
        engine.wait_all().wait().unwrap();

        let json = parsed(&engine, "program.json");
        let tracks = tracks(&json);
        let ops = ops(&json);

        // Every op once, under its name, with its variables.
        let mut names: Vec<&str> = ops.values().map(|o| o.name.as_str()).collect();
        names.sort_unstable();
        assert_eq!(names, ["chain", "join", "left", "right", "root"]);
        let by_name = |n: &str| ops.iter().find(|(_, o)| o.name == n).unwrap();
        let (_, join) = by_name("join");
        assert_eq!(join.vars("reads"), ids(&[&c, &d]).into_iter().collect());
        assert_eq!(join.vars("mutates"), ids(&[&e]).into_iter().collect());
        assert_eq!(join.args["device"], "cpu");

        // Each op's steps in order.
        for op in ops.values() {
            let pushed = op.at("pushed_us").unwrap();
            let ready = op.at("ready_us").unwrap();
            let started = op.at("started_us").unwrap();
            let ended = op.at("ended_us").unwrap();
            assert!(
                pushed <= ready && ready <= started && started <= ended,
                "{}",
                op.name
            );
        }

        // One track per worker, each op's slices on a worker; the two
        // ops at the barrier on different workers.
        let workers: HashSet<&str> = tracks.values().map(String::as_str).collect();
        assert_eq!(workers, HashSet::from(["depflow-cpu-0", "depflow-cpu-1"]));
        assert_eq!(tracks.len(), 2, "one track per worker: {tracks:?}");
        assert_ne!(by_name("left").1.tid, by_name("right").1.tid);

        // Flows: exactly one into each op after the root, from an op it
        // depends on (it reads what that op mutates).
        let flows = flows(&json);
        let mut into: HashMap<u64, u64> = HashMap::new();
        for &(_, to_tid, target) in &flows {
            let op = &ops[&target];
            assert_eq!(op.tid, to_tid, "a flow ends on its target's track");
            assert!(
                into.insert(target, 0).is_none(),
                "one flow into {}",
                op.name
            );
            let from = ops[&target].args["unblocked_by"].as_u64().unwrap();
            let source = &ops[&from];
            assert!(
                !op.vars("reads").is_disjoint(&source.vars("mutates")),
                "{} unblocked by {}, which it does not depend on",
                op.name,
                source.name
            );
        }
        let (root_id, _) = by_name("root");
        let expected: HashSet<u64> = ops.keys().copied().filter(|id| id != root_id).collect();
        assert_eq!(into.keys().copied().collect::<HashSet<_>>(), expected);
        let (chain_id, _) = by_name("chain");
        assert_eq!(by_name("left").1.args["unblocked_by"], *chain_id);
        assert_eq!(by_name("chain").1.args["unblocked_by"], *root_id);

        // The ops-in-flight counter goes back to 0.
        let last = of_phase(&json, "C")
            .filter(|e| e["name"] == "ops in flight")
            .last()
            .unwrap();
        assert_eq!(last["args"]["ops"], 0);
    });
}

#[test]
fn device_work_has_a_track_per_lane_and_units_a_counter() {
    within(60, || {
        let engine = Engine::builder()
            .threads(1)
            .device("gpu", Executor::simulated_gpu(2))
            .tracing(Tracing::On)
            .build()
            .unwrap();
        let gpu = engine.device("gpu").unwrap();
        let memory = engine.new_resource("memory", 2);
        let (x, y) = (engine.new_var(), engine.new_var());
        for (lane, v) in [(Lane::Compute(0), &x), (Lane::Compute(1), &y)] {
            engine
                .op()
                .name("kernel")
                .on(gpu)
                .lane(lane)
                .mutates(&[v])
                .uses(&memory, 1)
                .run(|ctx| Ok(ctx.stream()?.enqueue(|| Ok(()))?))
                .unwrap();
        }
        engine
            .op()
            .name("host")
            .reads(&[&x, &y])
            .run(|_| Ok(()))
            .unwrap();
        engine.wait_all().wait().unwrap();

        let trace = engine.trace().unwrap();
        let lanes: Vec<&str> = trace
            .tracks()
            .iter()
            .filter(|t| t.is_lane)
            .map(|t| t.name.as_str())
            .collect();
        assert_eq!(lanes.len(), 2, "{lanes:?}");
        assert!(lanes.iter().all(|l| l.starts_with("gpu lane ")));
        for op in trace.ops().iter().filter(|o| o.name() == Some("kernel")) {
            let (start, end) = (op.enqueued().unwrap(), op.ended().unwrap());
            assert!(op.started().unwrap() <= start && start <= end);
            let device_slice = op.slices().last().unwrap();
            assert!(trace.tracks()[device_slice.track].is_lane);
            assert_eq!(device_slice.end, Some(end));
        }
        let memory = &trace.resources()[0];
        assert_eq!(memory.name, "memory");
        assert!(memory.in_use.iter().any(|&(_, n)| n > 0));
        assert!(memory.in_use.iter().all(|&(_, n)| n <= 2));
        assert_eq!(memory.in_use.last().unwrap().1, 0);

        let json = parsed(&engine, "gpu.json");
        assert!(of_phase(&json, "C").any(|e| e["name"] == "units of memory"));
        assert_eq!(
            of_phase(&json, "X")
                .filter(|e| e["cat"] == "device")
                .count(),
            2
        );
    });
}

#[test]
fn an_async_body_shows_one_slice_per_poll() {
    within(60, || {
        let engine = traced_engine(1);
        let v = engine.new_var();
        let (tx, rx) = futures::channel::oneshot::channel::<()>();
        let op = engine
            .op()
            .name("awaits")
            .mutates(&[&v])
            .run_async(|_| async move {
                rx.await.unwrap();
                Ok(())
            })
            .unwrap();
        // Until the body suspended (its first slice ended): sent earlier,
        // its first poll would find the value and run in one slice.
        while engine.trace().unwrap().ops()[0]
            .slices()
            .first()
            .is_none_or(|s| s.end.is_none())
        {
            std::thread::yield_now();
        }
        tx.send(()).unwrap();
        op.wait().unwrap();
        let trace = engine.trace().unwrap();
        let slices = trace.ops()[0].slices();
        assert_eq!(slices.len(), 2, "{slices:?}");
        assert!(slices[0].end.unwrap() <= slices[1].start);
    });
}

#[test]
fn a_full_buffer_drops_the_oldest_events_and_counts_them() {
    let engine = Engine::builder()
        .executor(Executor::inline())
        .tracing(Tracing::On)
        .trace_buffer(64)
        .build()
        .unwrap();
    let v = engine.new_var();
    for _ in 0..100 {
        engine.op().mutates(&[&v]).run(|_| Ok(())).unwrap();
    }
    engine.wait_all().wait().unwrap();
    let trace = engine.trace().unwrap();
    assert!(trace.dropped_events() > 0);
    // The newest ops are whole; none that lost its push is made up.
    assert!(!trace.ops().is_empty() && trace.ops().len() < 100);
    let last = trace.ops().last().unwrap();
    assert!(last.ended().is_some());
    assert_eq!(last.mutates(), [v.id()]);
}

#[test]
fn tracing_off_and_bad_paths_are_errors() {
    let engine = Engine::new();
    assert!(matches!(engine.trace(), Err(Error::Config(_))));
    assert!(matches!(engine.start_trace(), Err(Error::Config(_))));

    let engine = Engine::builder().tracing(Tracing::On).build().unwrap();
    let trace = engine.trace().unwrap();
    let dir = std::env::temp_dir();
    match trace.write_chrome_json(&dir) {
        Err(e @ Error::Io { .. }) => {
            assert!(e.to_string().contains(&dir.display().to_string()));
            assert!(std::error::Error::source(&e).is_some());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_window_records_only_what_ran_in_it() {
    let engine = Engine::builder()
        .threads(1)
        .tracing(Tracing::Paused)
        .build()
        .unwrap();
    let v = engine.new_var();
    let run = |name| {
        let op = engine.op().name(name).mutates(&[&v]).run(|_| Ok(()));
        op.unwrap().wait().unwrap();
    };
    run("before");
    assert!(engine.trace().unwrap().ops().is_empty());
    engine.start_trace().unwrap();
    run("inside");
    engine.stop_trace().unwrap();
    run("after");
    let trace = engine.trace().unwrap();
    let names: Vec<_> = trace.ops().iter().map(|o| o.name()).collect();
    assert_eq!(names, [Some("inside")]);
}

#[test]
fn a_skipped_op_is_in_the_json_as_skipped() {
    let engine = traced_engine(1);
    let (a, b) = (engine.new_var(), engine.new_var());
    let failed = engine
        .op()
        .name("fails")
        .mutates(&[&a])
        .run(|_| Err::<(), _>("no".into()));
    let skipped = engine
        .op()
        .name("skipped")
        .reads(&[&a])
        .mutates(&[&b])
        .run(|_| Ok(()));
    assert!(failed.unwrap().wait().is_err());
    assert!(matches!(
        skipped.unwrap().wait(),
        Err(Error::Poisoned { .. })
    ));
    let _ = engine.wait_all().wait();
    let json = parsed(&engine, "skipped.json");
    let ops = ops(&json);
    let skipped = ops
        .values()
        .find(|o| o.name == "skipped")
        .expect("the skipped op is there");
    assert_eq!(skipped.args["skipped"], true);
    assert!(skipped.at("started_us").is_none());
    assert!(ops.values().find(|o| o.name == "fails").unwrap().args["skipped"].is_null());
}

/// An op that last waited for units a deleted variable let go was unblocked
/// by no op: the trace does not blame the producer of its input.
#[test]
fn units_from_a_variable_unblock_no_op() {
    within(60, || {
        let engine = traced_engine(2);
        let memory = engine.new_resource("memory", 1);
        let (held, input, out) = (engine.new_var(), engine.new_var(), engine.new_var());
        allocate(&engine, &memory, 1, &held);
        let open = held_named_op(&engine, "produce", &input);
        let needs = engine
            .op()
            .name("needs")
            .reads(&[&input])
            .mutates(&[&out])
            .uses(&memory, 1)
            .run(|_| Ok(()))
            .unwrap();
        open.send(()).unwrap(); // `produce` ends; `needs` is ready, short of units
        while engine.diagnostics().waiting_for_units().is_empty() {
            std::thread::yield_now();
        }
        engine.delete_var(&held, drop).unwrap().wait().unwrap();
        needs.wait().unwrap();
        let trace = engine.trace().unwrap();
        let op = trace
            .ops()
            .iter()
            .find(|o| o.name() == Some("needs"))
            .unwrap();
        assert!(op.granted().unwrap() > op.ready().unwrap());
        assert_eq!(op.unblocked_by(), None);
    });
}

/// An op that waited for units another op gave back was unblocked by it.
#[test]
fn units_from_an_op_unblock_it() {
    within(60, || {
        let engine = traced_engine(2);
        let memory = engine.new_resource("memory", 1);
        let (a, b) = (engine.new_var(), engine.new_var());
        let (open, gate) = gate();
        engine
            .op()
            .name("holder")
            .mutates(&[&a])
            .uses(&memory, 1)
            .run(move |_| {
                gate.pass();
                Ok(())
            })
            .unwrap();
        engine
            .op()
            .name("waiter")
            .mutates(&[&b])
            .uses(&memory, 1)
            .run(|_| Ok(()))
            .unwrap();
        while engine.diagnostics().waiting_for_units().is_empty() {
            std::thread::yield_now();
        }
        open.send(()).unwrap();
        engine.wait_all().wait().unwrap();
        let trace = engine.trace().unwrap();
        let [holder, waiter] = trace.ops() else {
            panic!()
        };
        assert_eq!(waiter.unblocked_by(), Some(holder.id()));
    });
}

/// A recorded graph replayed three times: each replay's op keeps its own
/// slice, and every recorded op of every replay is a slice of its own,
/// with its name, on a thread (not a lane), inside the trace's time; and
/// the trace's API says the same.
#[test]
fn each_recorded_op_of_a_replay_is_a_slice_on_the_thread_that_ran_it() {
    let engine = traced_engine(2);
    let x = engine.new_var();
    let outs: Vec<_> = (0..3).map(|_| engine.new_var()).collect();
    let graph = engine
        .record(|rec| {
            rec.name("step");
            rec.op().name("produce").mutates(&[&x]).run(|_| Ok(()))?;
            for (i, out) in outs.iter().enumerate() {
                rec.op()
                    .name(format!("consume {i}"))
                    .reads(&[&x])
                    .mutates(&[out])
                    .run(|_| Ok(()))?;
            }
            rec.op()
                .reads(&[&outs[0], &outs[1], &outs[2]])
                .run(|_| Ok(()))
        })
        .unwrap();
    for _ in 0..3 {
        graph.replay();
    }
    engine.wait_all().wait().unwrap();
    let recorded = [
        "produce",
        "consume 0",
        "consume 1",
        "consume 2",
        "recorded op",
    ];

    let trace = engine.trace().unwrap();
    let replays: Vec<_> = trace
        .ops()
        .iter()
        .filter(|op| op.name() == Some("replay step"))
        .collect();
    assert_eq!(replays.len(), 3);
    for replay in &replays {
        assert!(!replay.slices().is_empty(), "the replay's own slice");
        let mut names: Vec<&str> = replay
            .replayed()
            .iter()
            .map(|r| r.name.as_deref().unwrap_or("recorded op"))
            .collect();
        names.sort_unstable();
        let mut expected = recorded.to_vec();
        expected.sort_unstable();
        assert_eq!(names, expected, "each recorded op once per replay");
        for run in replay.replayed() {
            assert!(!trace.tracks()[run.slice.track].is_lane);
            let end = run.slice.end.expect("ended");
            assert!(replay.pushed() <= run.slice.start && run.slice.start <= end);
            assert!(end <= replay.ended().expect("the replay ended"));
        }
    }

    let json = parsed(&engine, "replays.json");
    let threads = tracks(&json);
    let ops = ops(&json);
    let replay_ids: Vec<u64> = ops
        .iter()
        .filter(|(_, op)| op.name == "replay step")
        .map(|(&id, _)| id)
        .collect();
    assert_eq!(replay_ids.len(), 3, "the replays' own slices are there");
    for id in replay_ids {
        let mut names: Vec<&str> = of_phase(&json, "X")
            .filter(|e| e["cat"] == "recorded" && e["args"]["replay"] == id)
            .map(|e| {
                let tid = e["tid"].as_u64().unwrap();
                assert!(!threads[&tid].contains("lane"), "on a thread: {e}");
                assert!(e["dur"].as_f64().unwrap() >= 0.0);
                e["name"].as_str().unwrap()
            })
            .collect();
        names.sort_unstable();
        let mut expected = recorded.to_vec();
        expected.sort_unstable();
        assert_eq!(names, expected, "replay {id}: each recorded op once");
    }
}

/// The slow steps of a replay too: an op on a stream device (its enqueue),
/// one on a second device that waits for the first's device work (it may
/// be woken before that work is done: a run that did not start is none),
/// a host op with units and one after them: each once per replay.
#[test]
fn recorded_stream_and_units_ops_are_slices_once_per_replay() {
    within(60, || {
        let engine = Engine::builder()
            .threads(2)
            .device("gpu", Executor::simulated_gpu(2))
            .device("gpu2", Executor::simulated_gpu(1))
            .tracing(Tracing::On)
            .build()
            .unwrap();
        let (gpu, gpu2) = (
            engine.device("gpu").unwrap(),
            engine.device("gpu2").unwrap(),
        );
        let memory = engine.new_resource("memory", 1);
        let (a, b, c) = (engine.new_var(), engine.new_var(), engine.new_var());
        let graph = engine
            .record(|rec| {
                let kernel = |ctx: &depflow::OpCtx| {
                    Ok(ctx.stream()?.enqueue(|| {
                        std::thread::sleep(std::time::Duration::from_millis(2));
                        Ok(())
                    })?)
                };
                rec.op().name("kernel").on(gpu).mutates(&[&a]).run(kernel)?;
                rec.op()
                    .name("copy")
                    .on(gpu2)
                    .reads(&[&a])
                    .mutates(&[&b])
                    .run(kernel)?;
                rec.op()
                    .name("host with units")
                    .reads(&[&b])
                    .mutates(&[&c])
                    .uses(&memory, 1)
                    .run(|_| Ok(()))?;
                rec.op().name("last").reads(&[&c]).run(|_| Ok(()))
            })
            .unwrap();
        for _ in 0..3 {
            graph.replay();
        }
        engine.wait_all().wait().unwrap();
        let trace = engine.trace().unwrap();
        let replays: Vec<_> = trace
            .ops()
            .iter()
            .filter(|op| op.name() == Some("replay"))
            .collect();
        assert_eq!(replays.len(), 3);
        for replay in replays {
            let mut names: Vec<&str> = replay
                .replayed()
                .iter()
                .map(|r| r.name.as_deref().unwrap())
                .collect();
            names.sort_unstable();
            assert_eq!(names, ["copy", "host with units", "kernel", "last"]);
            for run in replay.replayed() {
                assert!(!trace.tracks()[run.slice.track].is_lane);
                assert!(run.slice.end.is_some());
            }
        }
    });
}

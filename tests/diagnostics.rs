//! What a stuck engine says about itself: counts that mean one thing, who
//! holds a resource's units, what each op waits for and for how long.

mod common;

use std::sync::mpsc;

use common::held::held_op;
use common::traced::{held_named_op, tracked_engine};
use common::units::{Abandoned, allocate, loads_pushed_before_their_consumers};
use common::within;
use depflow::{BoxError, Cycle, Engine, Needs, OpState};

/// Ten ops parked behind a gate, on an engine with no bound on ops in flight.
#[test]
fn in_flight_counts_unfinished_ops_with_or_without_a_bound() {
    for bound in [0, 100] {
        let engine = Engine::builder()
            .threads(2)
            .max_in_flight(bound)
            .build()
            .unwrap();
        let gate = engine.var(());
        let (open, _) = held_op(&engine, &gate, |_| Ok(()));
        for _ in 0..9 {
            let v = engine.new_var();
            engine
                .push(&[&gate], &[&v], |_| Ok::<_, BoxError>(()))
                .unwrap();
        }
        assert_eq!(engine.in_flight(), 10, "bound {bound}");
        assert_eq!(engine.diagnostics().in_flight(), 10, "bound {bound}");
        open.send(()).unwrap();
        let e = engine.clone();
        within(10, move || e.wait_all().wait()).unwrap();
        assert_eq!(engine.in_flight(), 0, "bound {bound}");
        assert_eq!(engine.diagnostics().in_flight(), 0, "bound {bound}");
    }
}

/// A stuck program, as its report tells it: an async op awaiting, two ops
/// running, one queued behind them, one waiting for units that a running op
/// and a named variable hold, one waiting for a variable.
#[test]
fn diagnostics_tell_running_queued_awaiting_and_who_holds_units() {
    let engine = tracked_engine(2);
    let memory = engine.new_resource("memory", 4);
    let cache = engine.var_named("cache", ());
    let (acts, out) = (engine.var_named("activations", ()), engine.new_var());
    let (a, b, c, d) = (
        engine.new_var(),
        engine.new_var(),
        engine.new_var(),
        engine.new_var(),
    );
    allocate(&engine, &memory, 2, &cache);

    // "fetch" awaits a reply that comes at the end.
    let (started_tx, started) = mpsc::channel::<&'static str>();
    let (reply_tx, reply) = futures::channel::oneshot::channel::<()>();
    let tx = started_tx.clone();
    let fetch = engine
        .op()
        .name("fetch")
        .mutates(&[&a])
        .run_async(move |_| async move {
            tx.send("fetch").unwrap();
            reply.await?;
            Ok::<_, BoxError>(())
        })
        .unwrap();
    assert_eq!(started.recv().unwrap(), "fetch");
    // "compute" (holding a unit) and "spin" occupy both workers.
    let mut gates = Vec::new();
    for (name, var) in [("compute", &b), ("spin", &c)] {
        let (open, gate) = mpsc::channel::<()>();
        gates.push(open);
        let (tx, gate) = (started_tx.clone(), std::sync::Mutex::new(gate));
        let vars: [&dyn depflow::AnyVar; 1] = [var];
        let op = engine.op().name(name).mutates(&vars);
        let op = if name == "compute" {
            op.uses(&memory, 1)
        } else {
            op
        };
        op.run(move |_| -> Result<(), BoxError> {
            tx.send(name).unwrap();
            gate.lock().unwrap().recv()?;
            Ok(())
        })
        .unwrap();
    }
    let mut running = [started.recv().unwrap(), started.recv().unwrap()];
    running.sort_unstable();
    assert_eq!(running, ["compute", "spin"]);
    let ok = |_: &depflow::OpCtx| Ok::<_, BoxError>(());
    engine.op().name("later").mutates(&[&d]).run(ok).unwrap();
    engine
        .op()
        .name("needs memory")
        .mutates(&[&acts])
        .uses(&memory, 2)
        .run(ok)
        .unwrap();
    engine
        .op()
        .name("after it")
        .reads(&[&acts])
        .mutates(&[&out])
        .run(ok)
        .unwrap();

    let e = engine.clone();
    let report = within(10, move || {
        loop {
            let report = e.diagnostics();
            let ops = report.ops().expect("tracked");
            if ops[0].state() == &OpState::Awaiting {
                return report;
            }
            std::thread::yield_now();
        }
    });
    let text = report.to_string();
    let ops = report.ops().unwrap();
    let states: Vec<(Option<&str>, &OpState)> = ops.iter().map(|o| (o.name(), o.state())).collect();
    assert_eq!(states.len(), 6, "{text}");
    assert_eq!(states[0], (Some("fetch"), &OpState::Awaiting), "{text}");
    assert_eq!(states[1], (Some("compute"), &OpState::Running), "{text}");
    assert_eq!(states[2], (Some("spin"), &OpState::Running), "{text}");
    assert_eq!(states[3], (Some("later"), &OpState::Queued), "{text}");
    assert_eq!(
        states[4],
        (
            Some("needs memory"),
            &OpState::Units(vec![("memory".into(), 2)])
        ),
        "{text}"
    );
    assert_eq!(
        states[5],
        (
            Some("after it"),
            &OpState::Variables(vec![(acts.id(), vec!["`needs memory`".into()])])
        ),
        "{text}"
    );
    assert!(ops.iter().all(|o| o.waited().is_some()), "{text}");
    let res = &report.resources()[0];
    assert_eq!(res.free(), 1, "{text}");
    assert_eq!(res.held_by_ops(), [("`compute`".to_string(), 1)], "{text}");
    assert_eq!(res.held_by_vars(), [(cache.id(), 2)], "{text}");

    for line in [
        "resource `memory`: 1 of 4 free\n  1 held by op `compute`\n  2 held by variable `cache` (var#",
        "`fetch` is awaiting inside its body; pushed ",
        "`compute` is running; pushed ",
        "`later` is queued: ready, waiting for a worker; pushed ",
        "`needs memory` waits for units: 2 of `memory` (1 of 4 free); pushed ",
        "`after it` waits for variables: `activations` (var#",
    ] {
        assert!(text.contains(line), "no `{line}` in:\n{text}");
    }

    // Unstuck: everything runs; a deleted variable holds nothing.
    for gate in gates {
        gate.send(()).unwrap();
    }
    reply_tx.send(()).unwrap();
    let e = engine.clone();
    within(10, move || {
        futures::executor::block_on(fetch).unwrap();
        e.delete_var(&cache, drop).unwrap();
        e.wait_all().wait()
    })
    .unwrap();
    let report = engine.diagnostics();
    assert_eq!(report.ops().map(<[_]>::len), Some(0), "{report}");
    assert!(report.resources()[0].held_by_vars().is_empty(), "{report}");
    assert!(report.resources()[0].held_by_ops().is_empty(), "{report}");
}

/// A variable that allocated units and is dropped (not deleted) stops
/// holding them in the report once it is freed.
#[test]
fn a_dropped_variable_no_longer_holds_units() {
    let engine = Engine::builder().track_ops(true).build().unwrap();
    let memory = engine.new_resource("memory", 4);
    let buffer = engine.var_named("buffer", vec![0u8; 16]);
    allocate(&engine, &memory, 3, &buffer);
    let id = buffer.id();
    assert_eq!(
        engine.diagnostics().resources()[0].held_by_vars(),
        [(id, 3)]
    );
    drop(buffer);
    let e = engine.clone();
    within(10, move || {
        while !e.diagnostics().resources()[0].held_by_vars().is_empty() {
            e.wait_all().wait().unwrap();
            std::thread::yield_now();
        }
    });
    assert_eq!(memory.in_use(), 0);
}

/// Without tracking the report lists the ops parked for units only, and
/// says so.
#[test]
fn an_untracked_report_says_what_it_leaves_out() {
    let engine = Engine::new();
    let memory = engine.new_resource("memory", 1);
    let v = engine.var_named("held", ());
    allocate(&engine, &memory, 1, &v);
    let report = engine.diagnostics();
    assert!(report.ops().is_none());
    assert!(report.resources()[0].held_by_vars().is_empty());
    assert!(
        report
            .to_string()
            .contains("only with EngineBuilder::track_ops")
    );
}

/// Polls the engine's report until `ready` says it shows what the test
/// waits for (the workers get there on their own time).
fn report_when(
    engine: &Engine,
    ready: impl Fn(&depflow::Diagnostics) -> bool + Send + 'static,
) -> depflow::Diagnostics {
    let e = engine.clone();
    within(10, move || {
        loop {
            let report = e.diagnostics();
            if ready(&report) {
                return report;
            }
            std::thread::yield_now();
        }
    })
}

/// An async op holding units awaits the handle of an op that needs them:
/// the report (on demand, no watchdog) names the cycle.
#[test]
fn an_op_awaiting_an_op_that_needs_its_units_is_a_named_cycle() {
    let engine = tracked_engine(2);
    let memory = engine.new_resource("memory", 1);
    let (a, b) = (engine.new_var(), engine.new_var());
    let (give_up, given_up) = futures::channel::oneshot::channel::<()>();
    let (e, m, b2) = (engine.clone(), memory.clone(), b.clone());
    engine
        .op()
        .name("holder")
        .mutates(&[&a])
        .uses(&memory, 1)
        .run_async(move |_| async move {
            use futures::FutureExt;
            let needy = e
                .op()
                .name("needy")
                .mutates(&[&b2])
                .uses(&m, 1)
                .run(|_| Ok(()))?;
            drop(e);
            futures::select! {
                done = needy.fuse() => done?,
                _ = given_up.fuse() => {}
            }
            Ok::<_, BoxError>(())
        })
        .unwrap();
    let report = report_when(&engine, |r| !r.cycles().is_empty());
    let text = report.to_string();
    assert_eq!(
        report.cycles(),
        [Cycle::Ops(vec![
            ("`holder`".into(), Needs::Result),
            ("`needy`".into(), Needs::Units("memory".into())),
        ])],
        "{text}"
    );
    for line in [
        "`holder` is awaiting inside its body, for the result of `needy`",
        "deadlock: `holder` waits for the result of `needy`; `needy` waits for units of `memory` held by `holder`",
        // The older hint about the same situation still comes.
        "possible deadlock: `holder` awaits inside its body holding 1 of `memory`",
    ] {
        assert!(text.contains(line), "no `{line}` in:\n{text}");
    }
    give_up.send(()).unwrap();
    let e = engine.clone();
    within(10, move || e.wait_all().wait()).unwrap();
    assert!(engine.diagnostics().cycles().is_empty());
}

/// Ops queued on one variable behind a running op: each waiting op's chain
/// goes through the ops ahead of it to the one that holds the variable.
#[test]
fn a_report_chains_each_wait_to_the_op_holding_the_variable() {
    let engine = tracked_engine(2);
    let x = engine.var_named("x", ());
    let open = held_named_op(&engine, "gate", &x);
    let ok = |_: &depflow::OpCtx| Ok::<_, BoxError>(());
    engine.op().name("write").mutates(&[&x]).run(ok).unwrap();
    engine.op().name("read").reads(&[&x]).run(ok).unwrap();
    let report = report_when(&engine, |r| {
        r.ops().unwrap()[0].state() == &OpState::Running
    });
    let text = report.to_string();
    assert!(report.cycles().is_empty(), "{text}");
    let chain = "  `read` waits for `x` (var#";
    let rest = ") (after `write`) -> `write` waits for `x` (var#";
    let end = "), held by `gate` -> `gate` is running (for ";
    let line = text
        .lines()
        .find(|l| l.starts_with(chain))
        .unwrap_or_else(|| panic!("no chain for `read` in:\n{text}"));
    assert!(line.contains(rest) && line.contains(end), "{text}");
    // `write` is in that chain: it gets none of its own.
    assert!(!text.contains("  `write` waits"), "{text}");
    open.send(()).unwrap();
    let e = engine.clone();
    within(10, move || e.wait_all().wait()).unwrap();
}

/// Loads pushed before their consumers on too few units (see
/// `loads_pushed_before_their_consumers`): the deadlock is named as a
/// cycle: which op waits for which units, held by which variable, given
/// back only by an op pushed after it that waits for it; and what to do
/// about it.
#[test]
fn loads_pushed_before_their_consumers_are_a_named_units_cycle() {
    let engine = Abandoned(tracked_engine(2));
    let bufs = loads_pushed_before_their_consumers(&engine);
    let report = report_when(&engine, |r| {
        r.ops()
            .unwrap()
            .iter()
            .filter(|o| matches!(o.state(), OpState::Units(_)))
            .count()
            == 4
    });
    let text = report.to_string();
    println!("{text}");
    let preprocess = Needs::Variable(bufs[0].id());
    assert_eq!(
        report.cycles(),
        [Cycle::Ops(vec![
            (
                "`load 2`".into(),
                Needs::Freed {
                    resource: "memory".into(),
                    var: bufs[0].id()
                }
            ),
            ("`delete_var`".into(), preprocess),
            ("`preprocess 0`".into(), Needs::Turn("memory".into())),
        ])],
        "{text}"
    );
    for line in [
        "deadlock: `load 2` waits for units of `memory` held by `buf0` (var#",
        "), which only `delete_var` gives back; `delete_var` waits for `buf0` (var#",
        "), held by `preprocess 0`; `preprocess 0` waits for its turn for units of `memory`, \
         after `load 2`: none of them can go on",
        "pushed after",
        "does not fit `memory` when run serially",
        "push each consumer",
        "more units",
    ] {
        assert!(text.contains(line), "no `{line}` in:\n{text}");
    }
    // Op by op, each chain goes on from a variable's units to the op that
    // gives them back.
    for line in [
        "-> `load 2` waits for 1 of `memory` (0 of 2 free), held by variable `buf0` (var#",
        ") (given back by `delete_var`), variable `buf1` (var#",
        ") (given back by `delete_var`) -> `delete_var` waits for `buf0` (var#",
    ] {
        assert!(text.contains(line), "no `{line}` in:\n{text}");
    }
}

/// The same program with ops running that hold units, and preprocess ops
/// that allocate nothing: a busy resource, and buffers that ops pushed
/// later free, but those go on without the loads waiting: no cycle, and
/// it runs to the end once the running ops do.
#[test]
fn a_busy_resource_is_no_deadlock() {
    let engine = tracked_engine(4);
    let memory = engine.new_resource("memory", 2);
    let mut gates = Vec::new();
    for i in 0..2 {
        let (open, gate) = mpsc::channel::<()>();
        gates.push(open);
        let gate = std::sync::Mutex::new(gate);
        let v = engine.new_var();
        engine
            .op()
            .name(format!("busy {i}"))
            .mutates(&[&v])
            .uses(&memory, 1)
            .run(move |_| -> Result<(), BoxError> { Ok(gate.lock().unwrap().recv()?) })
            .unwrap();
    }
    let ok = |_: &depflow::OpCtx| Ok::<_, BoxError>(());
    let bufs: Vec<_> = (0..4)
        .map(|i| engine.var_named(format!("buf{i}"), ()))
        .collect();
    for (i, buf) in bufs.iter().enumerate() {
        engine
            .op()
            .name(format!("load {i}"))
            .mutates(&[buf])
            .allocates(&memory, 1, buf)
            .run(ok)
            .unwrap();
    }
    let out = engine.new_var();
    for (i, buf) in bufs.iter().enumerate() {
        engine
            .op()
            .name(format!("preprocess {i}"))
            .reads(&[buf])
            .mutates(&[&out])
            .run(ok)
            .unwrap();
        engine.delete_var(buf, drop).unwrap();
    }
    let report = report_when(&engine, |r| {
        r.ops()
            .unwrap()
            .iter()
            .filter(|o| o.state() == &OpState::Running)
            .count()
            == 2
            && r.ops()
                .unwrap()
                .iter()
                .filter(|o| matches!(o.state(), OpState::Units(_)))
                .count()
                == 4
    });
    let text = report.to_string();
    assert!(report.cycles().is_empty(), "{text}");
    assert!(!text.contains("deadlock"), "{text}");
    for gate in gates {
        gate.send(()).unwrap();
    }
    // Midway (the first loads hold both units, the third waits for a
    // delete pushed after it): never a cycle.
    let e = engine.clone();
    within(10, move || {
        while e.in_flight() > 0 {
            let report = e.diagnostics();
            assert!(report.cycles().is_empty(), "{report}");
        }
        e.wait_all().wait()
    })
    .unwrap();
    assert_eq!(memory.in_use(), 0);
}

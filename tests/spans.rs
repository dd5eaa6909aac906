//! `tracing` spans for ops (feature `tracing`): one `op` span per op with
//! its fields, inside the span current at its push, entered while its body
//! runs, following from the op that unblocked it, with step events. A
//! hand-written subscriber records what it is told.
#![cfg(feature = "tracing")]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use common::traced::held_named_op;
use common::within;
use depflow::Engine;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// A span as made: its name, fields and parent.
type Made = (String, HashMap<String, String>, Option<u64>);

#[derive(Default)]
struct Seen {
    /// Span id -> what it was made with.
    spans: HashMap<u64, Made>,
    /// (span id, entered) in order, with the thread.
    enters: Vec<(u64, bool, std::thread::ThreadId)>,
    follows: Vec<(u64, u64)>,
    /// (parent span, message).
    events: Vec<(u64, String)>,
}

#[derive(Clone, Default)]
struct Recorder {
    next: Arc<AtomicU64>,
    seen: Arc<Mutex<Seen>>,
    /// The span each thread is in, innermost last.
    stack: Arc<Mutex<HashMap<std::thread::ThreadId, Vec<u64>>>>,
}

struct Fields(HashMap<String, String>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

impl Subscriber for Recorder {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, SeqCst) + 1;
        let mut fields = Fields(HashMap::new());
        attrs.record(&mut fields);
        let parent = if attrs.is_contextual() {
            let stack = self.stack.lock().unwrap();
            stack
                .get(&std::thread::current().id())
                .and_then(|s| s.last().copied())
        } else {
            attrs.parent().map(Id::into_u64)
        };
        let name = attrs.metadata().name().to_string();
        self.seen
            .lock()
            .unwrap()
            .spans
            .insert(id, (name, fields.0, parent));
        Id::from_u64(id)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, span: &Id, follows: &Id) {
        self.seen
            .lock()
            .unwrap()
            .follows
            .push((span.into_u64(), follows.into_u64()));
    }
    fn event(&self, event: &Event<'_>) {
        let mut fields = Fields(HashMap::new());
        event.record(&mut fields);
        if let Some(parent) = event.parent() {
            let message = fields.0.remove("message").unwrap_or_default();
            self.seen
                .lock()
                .unwrap()
                .events
                .push((parent.into_u64(), message));
        }
    }
    fn enter(&self, span: &Id) {
        let thread = std::thread::current().id();
        self.stack
            .lock()
            .unwrap()
            .entry(thread)
            .or_default()
            .push(span.into_u64());
        self.seen
            .lock()
            .unwrap()
            .enters
            .push((span.into_u64(), true, thread));
    }
    fn exit(&self, span: &Id) {
        let thread = std::thread::current().id();
        let popped = self
            .stack
            .lock()
            .unwrap()
            .get_mut(&thread)
            .and_then(Vec::pop);
        assert_eq!(
            popped,
            Some(span.into_u64()),
            "exit of a span not entered on this thread"
        );
        self.seen
            .lock()
            .unwrap()
            .enters
            .push((span.into_u64(), false, thread));
    }
}

#[test]
fn ops_are_spans_inside_the_pushers_span() {
    within(60, || {
        let recorder = Recorder::default();
        let seen = recorder.seen.clone();
        tracing::subscriber::set_global_default(recorder).unwrap();

        let engine = Engine::builder()
            .threads(2)
            .tracing_spans(true)
            .build()
            .unwrap();
        let (a, b) = (engine.var_named("a", ()), engine.new_var());
        let open = {
            let _step = tracing::info_span!("step").entered();
            let open = held_named_op(&engine, "produce", &a);
            engine
                .op()
                .name("consume")
                .reads(&[&a])
                .mutates(&[&b])
                .run(|_| Ok(()))
                .unwrap();
            open
        };
        open.send(()).unwrap();
        engine.wait_all().wait().unwrap();
        // A replay: its recorded op is a span inside the replay's.
        let graph = engine
            .record(|rec| {
                rec.op()
                    .name("recorded")
                    .reads(&[&a])
                    .mutates(&[&b])
                    .run(|_| Ok(()))
            })
            .unwrap();
        graph.replay().wait().unwrap();

        let seen = seen.lock().unwrap();
        let id_of = |name: &str| {
            *seen
                .spans
                .iter()
                .find(|(_, (n, f, _))| n == "op" && f.get("name").map(String::as_str) == Some(name))
                .unwrap_or_else(|| panic!("no span for {name}"))
                .0
        };
        let step = *seen
            .spans
            .iter()
            .find(|(_, (n, _, _))| n == "step")
            .unwrap()
            .0;
        let (produce, consume) = (id_of("produce"), id_of("consume"));
        for op in [produce, consume] {
            let (_, fields, parent) = &seen.spans[&op];
            assert_eq!(
                *parent,
                Some(step),
                "an op's span is a child of the pusher's"
            );
            assert_eq!(fields["device"], "cpu");
        }
        // Variables by name where they have one.
        let number = |v: &depflow::Var| {
            v.id()
                .to_string()
                .rsplit('#')
                .next()
                .unwrap()
                .trim_end_matches(')')
                .to_string()
        };
        assert_eq!(
            seen.spans[&consume].1["reads"],
            format!("[`a` (var#{})]", number(&a))
        );
        assert_eq!(
            seen.spans[&consume].1["mutates"],
            format!("[var#{}]", number(&b))
        );
        // Entered once while the body ran, and exited on the same thread.
        for op in [produce, consume] {
            let marks: Vec<_> = seen.enters.iter().filter(|(s, _, _)| *s == op).collect();
            assert_eq!(marks.len(), 2, "{marks:?}");
            assert!(marks[0].1 && !marks[1].1);
            assert_eq!(marks[0].2, marks[1].2);
        }
        assert!(
            seen.follows.contains(&(consume, produce)),
            "{:?}",
            seen.follows
        );
        let events_of = |op: u64| -> Vec<&str> {
            seen.events
                .iter()
                .filter(|(p, _)| *p == op)
                .map(|(_, m)| m.as_str())
                .collect()
        };
        assert_eq!(events_of(consume), ["ready", "ended"]);

        let (replay, recorded) = (id_of("replay"), id_of("recorded"));
        let (_, fields, parent) = &seen.spans[&recorded];
        assert_eq!(
            *parent,
            Some(replay),
            "a recorded op's span is its replay's child"
        );
        assert_eq!(fields["recorded"], "true");
        assert_eq!(fields["reads"], format!("[`a` (var#{})]", number(&a)));
        let marks: Vec<_> = seen
            .enters
            .iter()
            .filter(|(s, _, _)| *s == recorded)
            .collect();
        assert_eq!(marks.len(), 2, "entered once, while it ran: {marks:?}");
        assert!(marks[0].1 && !marks[1].1 && marks[0].2 == marks[1].2);
    });
}

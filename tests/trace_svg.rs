//! SVG timelines: the picture an engine's trace renders to, parsed as XML
//! and checked against the trace: well-formed, a labelled row per track, a
//! bar per slice in its track's row and in time order, plots for the
//! counters, arrows along the dependencies pushed, names escaped, and bad
//! paths as errors.

mod common;

use std::sync::mpsc;

use common::traced::{held_named_op, traced_engine};
use common::{gate, within};
use depflow::{Engine, Error, Executor, Lane, Trace, Tracing};
use roxmltree::{Document, Node};

fn has_class(node: &Node<'_, '_>, class: &str) -> bool {
    node.attribute("class")
        .is_some_and(|c| c.split_whitespace().any(|c| c == class))
}

fn of_class<'a, 'i>(doc: &'a Document<'i>, class: &'a str) -> Vec<Node<'a, 'i>> {
    doc.descendants().filter(|n| has_class(n, class)).collect()
}

fn num(node: &Node<'_, '_>, attribute: &str) -> f64 {
    node.attribute(attribute).unwrap().parse().unwrap()
}

/// The text of a node's `<title>` child.
fn title(node: &Node<'_, '_>) -> String {
    let title = node.children().find(|c| c.has_tag_name("title")).unwrap();
    title.text().unwrap_or("").to_string()
}

/// Parses `trace.to_svg()` and checks what holds for every trace: a row
/// label per track, a plot per counter, and a bar per slice in its track's
/// row, inside the picture, with its op's tooltip. Returns the SVG.
fn checked(trace: &Trace) -> String {
    let svg = trace.to_svg();
    let doc = Document::parse(&svg).expect("the SVG is well-formed XML");
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "svg");
    let width = num(&root, "width");

    let labels = of_class(&doc, "track");
    let mut names: Vec<&str> = labels.iter().map(|n| n.text().unwrap()).collect();
    let mut expected: Vec<&str> = trace.tracks().iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    expected.sort_unstable();
    assert_eq!(names, expected, "one label per track");
    let row_of = |track: usize| {
        let label = labels
            .iter()
            .find(|n| n.text() == Some(&trace.tracks()[track].name))
            .unwrap();
        num(label, "y")
    };

    let plots: Vec<_> = of_class(&doc, "plot")
        .iter()
        .map(|n| n.text().unwrap().to_string())
        .collect();
    let mut expected = vec!["ops in flight".to_string()];
    expected.extend(
        trace
            .resources()
            .iter()
            .map(|r| format!("units of {}", r.name)),
    );
    assert_eq!(plots, expected);
    assert_eq!(of_class(&doc, "counter").len(), plots.len());

    let bars = of_class(&doc, "slice");
    let slices: Vec<_> = trace
        .ops()
        .iter()
        .flat_map(|op| op.slices().iter().map(move |s| (op, s)))
        .collect();
    assert_eq!(bars.len(), slices.len(), "one bar per slice");
    for (bar, (op, slice)) in bars.iter().zip(&slices) {
        let name = op
            .name()
            .map_or_else(|| format!("op #{}", op.id()), str::to_string);
        let tip = title(bar);
        assert!(
            tip.starts_with(&format!("{name} (op #{}) on {}", op.id(), op.device())),
            "{tip}"
        );
        let (x, y, w, h) = (
            num(bar, "x"),
            num(bar, "y"),
            num(bar, "width"),
            num(bar, "height"),
        );
        assert!(x > 0.0 && w > 0.0 && x + w <= width, "{x} + {w} in {width}");
        // The label's baseline is inside its row, as the bar is.
        let label = row_of(slice.track);
        assert!(
            y < label && label < y + h,
            "{name}: bar at {y}, its row's label at {label}"
        );
        assert_eq!(
            bar.attribute("stroke-dasharray").is_some(),
            slice.end.is_none()
        );
    }
    svg
}

/// Ops on two thread pools and two stream lanes, a resource, a chain from
/// one device to the other, and a name XML must escape.
#[test]
fn the_picture_matches_the_trace() {
    within(60, || {
        let engine = Engine::builder()
            .threads(1)
            .device("other", Executor::pool(1))
            .device("gpu", Executor::simulated_gpu(2))
            .tracing(Tracing::On)
            .build()
            .unwrap();
        let (other, gpu) = (
            engine.device("other").unwrap(),
            engine.device("gpu").unwrap(),
        );
        let memory = engine.new_resource("memory <&>", 2);
        let (a, b, c, d) = (
            engine.new_var(),
            engine.new_var(),
            engine.new_var(),
            engine.new_var(),
        );
        // The producer waits until the consumer is pushed, so that the
        // consumer waits for it and is unblocked by it.
        let open = held_named_op(&engine, "produce", &a);
        let consume = engine
            .op()
            .name("consume")
            .on(other)
            .reads(&[&a])
            .mutates(&[&b]);
        consume.run(|_| Ok(())).unwrap();
        open.send(()).unwrap();
        let odd = r#"a <&> "b" 'c'"#;
        engine
            .op()
            .name(odd)
            .reads(&[&b])
            .mutates(&[&c])
            .run(|_| Ok(()))
            .unwrap();
        for (lane, v) in [(Lane::Compute(0), &c), (Lane::Compute(1), &d)] {
            let kernel = engine.op().name("kernel").on(gpu).lane(lane).mutates(&[v]);
            let kernel = kernel.uses(&memory, 1);
            kernel
                .run(|ctx| Ok(ctx.stream()?.enqueue(|| Ok(()))?))
                .unwrap();
        }
        engine.wait_all().wait().unwrap();

        let trace = engine.trace().unwrap();
        assert_eq!(trace.tracks().iter().filter(|t| t.is_lane).count(), 2);
        let svg = checked(&trace);
        let doc = Document::parse(&svg).unwrap();

        // The odd name, escaped in the file and whole once parsed.
        assert!(svg.contains("a &lt;&amp;&gt; &quot;b&quot; &apos;c&apos;"));
        assert!(!svg.contains(odd));
        let text = doc.descendants().filter(|n| n.has_tag_name("text"));
        assert!(text.clone().any(|n| n.text() == Some(odd)), "in the legend");
        assert!(
            text.clone()
                .any(|n| n.text() == Some("units of memory <&>"))
        );
        let tips: Vec<String> = of_class(&doc, "slice").iter().map(title).collect();
        assert!(tips.iter().any(|t| t.starts_with(&format!("{odd} (op #"))));

        // An arrow from the producer into the consumer, on another thread.
        let [produce, consume] = ["produce", "consume"]
            .map(|n| trace.ops().iter().find(|op| op.name() == Some(n)).unwrap());
        assert_eq!(consume.unblocked_by(), Some(produce.id()));
        assert_ne!(produce.slices()[0].track, consume.slices()[0].track);
        let flows: Vec<String> = of_class(&doc, "flow").iter().map(title).collect();
        let arrow = format!("op #{} unblocked op #{}", produce.id(), consume.id());
        assert!(flows.contains(&arrow), "{flows:?}");
        let unblocked = trace.ops().iter().filter(|op| op.unblocked_by().is_some());
        assert!(
            flows.len() <= unblocked.count(),
            "arrows only into unblocked ops"
        );

        // Bars in time order: the consumer's after the producer's.
        let bars = of_class(&doc, "slice");
        let bar = |id: u64| {
            bars.iter()
                .find(|b| title(b).contains(&format!("(op #{id})")))
                .unwrap()
        };
        let (p, c) = (bar(produce.id()), bar(consume.id()));
        assert!(
            num(p, "x") + num(p, "width") <= num(c, "x") + 2.5,
            "the consumer starts after the producer ends"
        );
    });
}

/// An op still running when the trace is taken: a dashed bar to the end.
#[test]
fn an_op_still_running_has_an_open_bar() {
    within(60, || {
        let engine = traced_engine(1);
        let (started, running) = mpsc::channel::<()>();
        let (open, gate) = gate();
        let v = engine.new_var();
        engine
            .op()
            .name("long")
            .mutates(&[&v])
            .run(move |_| {
                started.send(())?;
                gate.pass();
                Ok(())
            })
            .unwrap();
        running.recv().unwrap();
        let trace = engine.trace().unwrap();
        assert_eq!(trace.ops()[0].slices()[0].end, None);
        let svg = checked(&trace);
        assert!(svg.contains("stroke-dasharray=\"3,2\""));
        open.send(()).unwrap();
        engine.wait_all().wait().unwrap();
    });
}

#[test]
fn empty_and_overflowing_traces_are_pictures_too() {
    let engine = Engine::builder().tracing(Tracing::On).build().unwrap();
    let empty = engine.trace().unwrap();
    assert!(checked(&empty).contains("0 ops on 0 tracks"));

    // Four events per thread: the pushing thread drops most of its own.
    let engine = Engine::builder()
        .threads(1)
        .tracing(Tracing::On)
        .trace_buffer(4)
        .build()
        .unwrap();
    let v = engine.new_var();
    for _ in 0..10 {
        engine
            .op()
            .name("step")
            .mutates(&[&v])
            .run(|_| Ok(()))
            .unwrap();
    }
    engine.wait_all().wait().unwrap();
    let trace = engine.trace().unwrap();
    assert!(trace.dropped_events() > 0);
    let svg = checked(&trace);
    assert!(svg.contains(&format!("{} events dropped", trace.dropped_events())));
}

#[test]
fn a_path_that_cannot_be_written_is_an_error() {
    let engine = Engine::builder().tracing(Tracing::On).build().unwrap();
    let trace = engine.trace().unwrap();
    let dir = std::env::temp_dir();
    for path in [dir.clone(), dir.join("no such dir").join("t.svg")] {
        match trace.write_svg(&path) {
            Err(e @ Error::Io { .. }) => {
                assert!(e.to_string().contains(&path.display().to_string()), "{e}");
            }
            other => panic!("{other:?}"),
        }
    }
    let path = dir.join(format!("depflow-test-{}.svg", std::process::id()));
    trace.write_svg(&path).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), trace.to_svg());
    std::fs::remove_file(&path).unwrap();
}

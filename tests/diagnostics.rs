//! What a stuck engine says about itself: counts that mean one thing, who
//! holds a resource's units, what each op waits for and for how long.

mod common;

use std::sync::mpsc;

use common::within;
use depflow::{BoxError, Engine};

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
        let (open, wait) = mpsc::channel::<()>();
        let wait = std::sync::Mutex::new(wait);
        engine
            .push(&[], &[&gate], move |_| -> Result<(), BoxError> {
                wait.lock().unwrap().recv()?;
                Ok(())
            })
            .unwrap();
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

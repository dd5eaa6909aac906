//! Loom models of one variable's chain: appends, grants and completions.
#![cfg(loom)]

mod common;

use common::{Data, Op, assert_clean, chain};
use loom::thread;

/// An append races the completion of the write ahead of it (the token
/// holder may go idle, find the new edge, or hand over via PASSED).
#[test]
fn append_races_write_completion() {
    loom::model(|| {
        let c = chain();
        let data = Data::new();
        let w1 = Op::new(&[true]);
        w1.push1(&c);
        assert!(
            w1.is_ready(),
            "a write on an idle variable is granted at once"
        );

        let t = thread::spawn({
            let (c, w1, data) = (c.clone(), w1.clone(), data.clone());
            move || {
                data.write(1);
                w1.complete(&c, 0);
            }
        });
        let r2 = Op::new(&[false]);
        r2.push1(&c);
        r2.wait_ready();
        assert_eq!(data.read(), 1, "read granted before the write completed");
        r2.complete(&c, 0);
        t.join().unwrap();
        assert_clean(&[&w1, &r2]);
    });
}

/// Read, read, then write: both reads run at once; the write waits for both,
/// and the last reader out grants it exactly once.
#[test]
fn read_read_then_write() {
    loom::model(|| {
        let c = chain();
        let data = Data::new();
        let (r1, r2, w3) = (Op::new(&[false]), Op::new(&[false]), Op::new(&[true]));
        r1.push1(&c);
        r2.push1(&c);
        w3.push1(&c);
        assert!(
            r1.is_ready() && r2.is_ready(),
            "reads on an idle variable run at once"
        );
        assert!(!w3.is_ready(), "the write must wait for the reads");

        let readers: Vec<_> = [r1.clone(), r2.clone()]
            .into_iter()
            .map(|r| {
                let (c, data) = (c.clone(), data.clone());
                thread::spawn(move || {
                    assert_eq!(data.read(), 0);
                    r.complete(&c, 0);
                })
            })
            .collect();
        w3.wait_ready();
        data.write(3);
        w3.complete(&c, 0);
        for r in readers {
            r.join().unwrap();
        }
        assert_clean(&[&r1, &r2, &w3]);
    });
}

/// Write, then read, read: the reads are granted together when the write
/// completes, and see its effect.
#[test]
fn write_then_read_read() {
    loom::model(|| {
        let c = chain();
        let data = Data::new();
        let (w1, r2, r3) = (Op::new(&[true]), Op::new(&[false]), Op::new(&[false]));
        w1.push1(&c);
        r2.push1(&c);
        r3.push1(&c);
        assert!(!r2.is_ready() && !r3.is_ready());

        let readers: Vec<_> = [r2.clone(), r3.clone()]
            .into_iter()
            .map(|r| {
                let (c, data) = (c.clone(), data.clone());
                thread::spawn(move || {
                    r.wait_ready();
                    assert_eq!(data.read(), 1);
                    r.complete(&c, 0);
                })
            })
            .collect();
        data.write(1);
        w1.complete(&c, 0);
        for r in readers {
            r.join().unwrap();
        }
        assert_clean(&[&w1, &r2, &r3]);
    });
}

/// The last reader releases a write that is appended (and parks) while the
/// reads are completing.
#[test]
fn last_reader_releases_parked_writer() {
    loom::model(|| {
        let c = chain();
        let data = Data::new();
        let (r1, r2) = (Op::new(&[false]), Op::new(&[false]));
        r1.push1(&c);
        r2.push1(&c);
        let t = thread::spawn({
            let (c, r1, data) = (c.clone(), r1.clone(), data.clone());
            move || {
                assert_eq!(data.read(), 0);
                r1.complete(&c, 0);
            }
        });
        let w3 = Op::new(&[true]);
        let t2 = thread::spawn({
            let (c, w3) = (c.clone(), w3.clone());
            move || w3.push1(&c)
        });
        assert_eq!(data.read(), 0);
        r2.complete(&c, 0);
        t.join().unwrap();
        t2.join().unwrap();
        w3.wait_ready();
        data.write(1);
        w3.complete(&c, 0);
        assert_clean(&[&r1, &r2, &w3]);
    });
}

/// Two threads append to one chain concurrently while a third completes the
/// op ahead of them: each append is granted once, in some valid order, and
/// the write never overlaps a read.
#[test]
fn concurrent_appends_and_completion() {
    loom::model(|| {
        let c = chain();
        let data = Data::new();
        let w0 = Op::new(&[true]);
        w0.push1(&c);
        let (r, w) = (Op::new(&[false]), Op::new(&[true]));
        let tr = thread::spawn({
            let (c, r, data) = (c.clone(), r.clone(), data.clone());
            move || {
                r.push1(&c);
                r.wait_ready();
                let _ = data.read();
                r.complete(&c, 0);
            }
        });
        let tw = thread::spawn({
            let (c, w, data) = (c.clone(), w.clone(), data.clone());
            move || {
                w.push1(&c);
                w.wait_ready();
                data.write(2);
                w.complete(&c, 0);
            }
        });
        data.write(1);
        w0.complete(&c, 0);
        tr.join().unwrap();
        tw.join().unwrap();
        assert_clean(&[&w0, &r, &w]);
    });
}

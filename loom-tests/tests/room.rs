//! Loom models of the bound on ops in flight: a producer waiting for room
//! and the op whose completion makes it.
#![cfg(loom)]

use std::future::poll_fn;

use depflow::__loom::Room;
use loom::sync::Arc;
use loom::thread;

/// The op finishing races the producer registering: the producer is never
/// left waiting (loom reports a deadlock if the wake-up is lost).
#[test]
fn finishing_op_wakes_the_waiting_producer() {
    loom::model(|| {
        let room = Arc::new(Room::new(1));
        room.enter();
        let op = thread::spawn({
            let room = room.clone();
            move || room.leave()
        });
        loom::future::block_on(poll_fn(|cx| room.poll_room(cx)));
        op.join().unwrap();
        assert_eq!(room.in_flight(), 0);
    });
}

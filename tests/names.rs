//! Named variables: errors and `Debug` output say `` `name` (var#N) ``
//! instead of `var#N`, while the variable is alive.

use depflow::{BoxError, Engine, Error};

#[test]
fn errors_name_named_variables() {
    let engine = Engine::builder().threads(2).build().unwrap();
    let weights = engine.var_named("fc1.weight", vec![0.5f32; 4]);
    let grad = engine.var_named(String::from("fc1.grad"), vec![0f32; 4]);
    let rng = engine.var_named("rng", ());
    let id = weights.id();
    let shown = id.to_string();
    let number = shown
        .strip_prefix("`fc1.weight` (var#")
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("{shown}"));
    assert!(number.parse::<u64>().is_ok(), "{shown}");
    assert_eq!(id.name().as_deref(), Some("fc1.weight"));
    assert_eq!(format!("{id:?}"), shown);
    assert!(format!("{weights:?}").contains(&shown), "{weights:?}");

    // Errors a body meets.
    let (kw, kg, kr) = (weights.key(), grad.key(), rng.key());
    let errs = engine
        .push(&[&weights], &[&grad], move |ctx| -> Result<_, BoxError> {
            let not_declared = ctx.read(kr).err().map(|e| e.to_string());
            let not_mutable = ctx.write(kw).err().map(|e| e.to_string());
            let _g = ctx.write(kg)?;
            let borrowed = ctx.read(kg).err().map(|e| e.to_string());
            Ok((not_declared, not_mutable, borrowed))
        })
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        errs.0.as_deref(),
        Some(format!("the op did not declare {}", rng.id()).as_str())
    );
    assert!(errs.0.unwrap().contains("`rng` (var#"));
    assert!(errs.1.unwrap().contains("`fc1.weight` (var#"));
    assert!(errs.2.unwrap().contains("`fc1.grad` (var#"));

    // Errors a push meets.
    let other = Engine::new();
    let foreign = other
        .push(&[&weights], &[], |_| Ok::<_, BoxError>(()))
        .unwrap_err();
    assert_eq!(
        foreign.to_string(),
        format!("{shown} belongs to another engine")
    );
    engine.delete_var(&rng, drop).unwrap();
    let deleted = engine
        .push(&[&rng], &[], |_| Ok::<_, BoxError>(()))
        .unwrap_err();
    assert!(matches!(deleted, Error::Deleted(_)));
    assert!(deleted.to_string().starts_with("`rng` (var#"), "{deleted}");
    engine.wait_all().wait().unwrap();
}

#[test]
fn a_name_shows_while_its_variable_is_alive() {
    let engine = Engine::new();
    let plain = engine.new_var();
    let n = plain.id().to_string();
    assert!(n.starts_with("var#") && plain.id().name().is_none(), "{n}");

    let named = engine.var_named("staging", ());
    let id = named.id();
    let clone = named.clone();
    drop(named);
    assert_eq!(id.name().as_deref(), Some("staging"), "a clone keeps it");
    // An op holds the variable too.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    let op = engine
        .push(&[], &[&clone], move |_| -> Result<(), BoxError> {
            rx.lock().unwrap().recv()?;
            Ok(())
        })
        .unwrap();
    drop(clone);
    assert_eq!(id.name().as_deref(), Some("staging"), "its op keeps it");
    tx.send(()).unwrap();
    op.wait().unwrap();
    engine.wait_all().wait().unwrap();
    // Freed (by its op's pusher, on a later push or wait): forgotten.
    let _ = engine.new_var();
    engine.wait_all().wait().unwrap();
    assert_eq!(id.name(), None);
    assert_eq!(id.to_string(), format!("var#{}", &id.to_string()[4..]));
}

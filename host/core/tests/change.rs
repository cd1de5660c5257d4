//! The change report: which changes to an activity's signature break a
//! caller written against the old one, read from real components' types
//! (`examples/echo` and `examples/greeter` have types of every kind).

mod common;

use corral_core::sandbox::{ChangeReport, Flow, LoadedComponent, Sandbox, type_changes};
use wasmtime::component::types::Type;

use common::example;

fn load(sandbox: &Sandbox, name: &str) -> std::sync::Arc<LoadedComponent> {
    sandbox.load_file(&example(name)).unwrap()
}

/// The type of the first parameter of `activity`.
fn param(component: &LoadedComponent, activity: &str) -> Type {
    let found = component.activity(activity);
    found.map(|a| a.params[0].1.clone()).unwrap()
}

/// The type of field `name` of record type `record`.
fn field(record: &Type, name: &str) -> Type {
    let Type::Record(r) = record else {
        panic!("not a record")
    };
    r.fields().find(|f| f.name == name).map(|f| f.ty).unwrap()
}

#[test]
fn what_breaks_a_caller_depends_on_which_way_the_value_flows() {
    let sandbox = Sandbox::new(Default::default()).unwrap();
    let echo = load(&sandbox, "echo");
    let greeter = load(&sandbox, "greeter");
    let u32_ = param(&echo, "demo:echo/api.echo-u32");
    let string = param(&echo, "demo:echo/api.echo-string");
    // echo's person: first-name, max-count, nick (option), tags.
    let echo_person = param(&echo, "demo:echo/api.echo-record");
    // greeter's person: name, title (option), language (an enum).
    let greeter_person = param(&greeter, "demo:greeter/api.greet");
    let color = param(&echo, "demo:echo/api.echo-enum");
    let language = field(&greeter_person, "language");

    assert!(type_changes(&u32_, &u32_, Flow::In, "v").is_empty());
    assert_eq!(
        type_changes(&u32_, &string, Flow::Out, "the result"),
        ["the result: u32 became string"]
    );
    // A caller's argument: new required fields and removed fields break
    // it, a new optional field (`title`) does not.
    let mut into = type_changes(&echo_person, &greeter_person, Flow::In, "parameter `v`");
    into.sort();
    assert_eq!(
        into,
        [
            "parameter `v`: field `first-name` removed (a caller sending it is refused)",
            "parameter `v`: field `max-count` removed (a caller sending it is refused)",
            "parameter `v`: field `nick` removed (a caller sending it is refused)",
            "parameter `v`: field `tags` removed (a caller sending it is refused)",
            "parameter `v`: new required field `language`",
            "parameter `v`: new required field `name`",
        ]
    );
    // A result: removed fields break the reader, new ones do not.
    let out = type_changes(&echo_person, &greeter_person, Flow::Out, "the result");
    assert_eq!(out.len(), 4, "{out:?}");
    assert!(out.iter().all(|w| w.contains("removed")), "{out:?}");
    // Cases: a removed one breaks a caller sending it, a new one a caller
    // reading it.
    let cases_in = type_changes(&color, &language, Flow::In, "c");
    assert_eq!(cases_in.len(), 3, "{cases_in:?}");
    assert!(cases_in[0].contains("case `red` removed"), "{cases_in:?}");
    let cases_out = type_changes(&color, &language, Flow::Out, "c");
    assert_eq!(cases_out.len(), 3, "{cases_out:?}");
    assert!(cases_out[0].contains("new case `english`"), "{cases_out:?}");
    // Inside a list, an option, a tuple: the same rules, with the path.
    let lists = type_changes(
        &param(&echo, "demo:echo/api.echo-list"),
        &param(&echo, "demo:echo/api.echo-bytes"),
        Flow::In,
        "p",
    );
    assert_eq!(lists, ["p[]: list<s32> became u8"]);
}

#[test]
fn the_report_between_two_versions_names_what_was_added_removed_and_breaks() {
    let sandbox = Sandbox::new(Default::default()).unwrap();
    let v1 = sandbox.load_file(&example("versioned")).unwrap();
    let v2 = sandbox
        .load_file(&example("versioned").with_file_name("v2/versioned.wasm"))
        .unwrap();
    let forward = ChangeReport::between(&v1, &v2);
    let added: Vec<&str> = forward.added.iter().map(|a| a.name.as_str()).collect();
    assert_eq!(added, ["demo:versioned/extra.added"]);
    assert!(forward.removed.is_empty() && forward.changed.is_empty());
    assert!(!forward.breaks_callers());
    let back = ChangeReport::between(&v2, &v1);
    assert_eq!(back.removed, ["demo:versioned/extra.added"]);
    assert!(back.breaks_callers());
    assert!(ChangeReport::between(&v1, &v1).is_empty());
}

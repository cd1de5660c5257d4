//! `demo:greeter`: a typed activity. Build: `examples/build.sh`; run:
//! `corral run examples/dist/greeter.wasm demo:greeter/api.greet
//! '{"name":"Ada","language":"english"}' '"casual"'`.

use std::sync::atomic::{AtomicU32, Ordering};

use corral_guest::Failure;

corral_guest::generate!("demo:greeter/greeter");

use exports::demo::greeter::api::{Greeting, Guest, Language, Person, Tone};

static CALLS: AtomicU32 = AtomicU32::new(0);

struct Greeter;

fn salutation(language: Language, tone: &Tone) -> String {
    match (tone, language) {
        (Tone::Custom(word), _) => word.clone(),
        (Tone::Formal, Language::English) => "Good day".into(),
        (Tone::Casual, Language::English) => "Hi".into(),
        (Tone::Formal, Language::French) => "Bonjour".into(),
        (Tone::Casual, Language::French) => "Salut".into(),
        (Tone::Formal, Language::German) => "Guten Tag".into(),
        (Tone::Casual, Language::German) => "Hallo".into(),
    }
}

impl Guest for Greeter {
    fn greet(who: Person, tone: Tone) -> Result<Greeting, Failure> {
        let calls = CALLS.fetch_add(1, Ordering::SeqCst) + 1;
        if who.name.trim().is_empty() {
            return Err(Failure::new("EmptyName", "a name is required").non_retryable());
        }
        let name = match &who.title {
            Some(title) => format!("{title} {}", who.name),
            None => who.name.clone(),
        };
        corral_guest::log::info(&format!("greeting {name}"));
        Ok(Greeting {
            message: format!("{}, {name}!", salutation(who.language, &tone)),
            calls_in_instance: calls,
            attempt: corral_guest::info().attempt,
        })
    }

    fn greet_all(people: Vec<Person>) -> Vec<String> {
        people
            .iter()
            .map(|p| format!("{}, {}!", salutation(p.language, &Tone::Casual), p.name))
            .collect()
    }
}

export!(Greeter);

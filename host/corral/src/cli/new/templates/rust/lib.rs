//! `local:{{name}}`: activities in Rust. Build: ./build.sh; test: corral test.

use corral_guest::Failure;
use serde::{Deserialize, Serialize};

corral_guest::generate!("local:{{name}}/{{name}}");

use exports::local::{{snake_name}}::api::{Guest, Person};

#[derive(Serialize, Deserialize)]
struct Progress {
    count: u32,
}

struct Activities;

impl Guest for Activities {
    fn greet(who: Person) -> Result<String, Failure> {
        if who.name.is_empty() {
            return Err(Failure::new("EmptyName", "a greeting needs a name").non_retryable());
        }
        corral_guest::log::info(&format!("greeting {}", who.name));
        Ok(match who.title {
            Some(title) => format!("Hello, {title} {}!", who.name),
            None => format!("Hello, {}!", who.name),
        })
    }

    fn count(to: u32) -> Result<u32, Failure> {
        // A retry resumes from the count the last attempt heartbeated.
        let mut n = corral_guest::last_heartbeat::<Progress>().map_or(0, |p| p.count);
        while n < to {
            if corral_guest::is_cancelled() {
                return Err(Failure::cancelled());
            }
            n += 1;
            corral_guest::heartbeat(&Progress { count: n })
                .map_err(|e| Failure::new("Heartbeat", e.to_string()))?;
        }
        Ok(n)
    }
}

export!(Activities);

// demo:js-greeter — a JavaScript activity built with componentize-js.
//
// Build: examples/build.sh (needs node; installs componentize-js from npm).
// Run:   corral run examples/dist/js-greeter.wasm demo:js-greeter/api.greet \
//          '{"name":"Ada","languages":["en"],"visits":1}'
import { heartbeat, info, isCancelled, log } from 'corral:activity/context@0.1.0';

// What `remember` keeps: every task must start without it.
const held = [];
const ballast = [];

export const api = {
  shout(text) {
    return text.toUpperCase();
  },

  remember(text, times) {
    for (let i = 0; i < times; i++) {
      ballast.push(new Uint8Array(4 << 20).fill(text.charCodeAt(0) || 32));
      held.push(text);
    }
    return [...held];
  },

  greet(who) {
    if (!who.name) {
      // A thrown failure record is the `err` of `result<_, failure>`.
      throw { message: 'a greeting needs a name', kind: 'NoName', retryable: false };
    }
    const { attempt, activityType } = info();
    const visits = who.visits + 1n;
    log('info', `greeting ${who.name} (visit ${visits})`);
    return {
      message: `Hello, ${who.name}! Visit ${visits}, in ${who.languages.join(' or ') || 'any language'}.`,
      attempt,
      activityType,
    };
  },

  count(to) {
    // A retry resumes from the count the last attempt heartbeated.
    const last = info().lastHeartbeat;
    let n = last ? JSON.parse(last).count : 0;
    while (n < to) {
      if (isCancelled()) {
        throw { message: `cancelled at ${n}`, kind: 'Cancelled', retryable: false };
      }
      n += 1;
      heartbeat(JSON.stringify({ count: n }));
    }
    return n;
  },
};

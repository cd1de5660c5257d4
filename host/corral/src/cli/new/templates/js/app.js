// local:{{name}}: activities in JavaScript. Build: ./build.sh; test: corral test.
import { heartbeat, info, isCancelled, log } from 'corral:activity/context@0.1.0';

export const api = {
  greet(who) {
    if (!who.name) {
      // A thrown failure record is the `err` of `result<_, failure>`.
      throw { message: 'a greeting needs a name', kind: 'EmptyName', retryable: false };
    }
    log('info', `greeting ${who.name}`);
    return who.title ? `Hello, ${who.title} ${who.name}!` : `Hello, ${who.name}!`;
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

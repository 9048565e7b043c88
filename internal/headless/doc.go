// Package headless renders pages in a real headless Chromium for tests:
// the DOM after load, the console messages the page logged, and a
// screenshot. It runs the chromium binary (Debian's chromium package, or
// $CHROMIUM) with a fresh profile per call, no network beyond what the
// page itself loads, no proxy and no background services, so that a test
// sees what a person opening the page would see and nothing else.
//
// Tests call [RequireT] first: without a Chromium it skips the test, or
// fails it where missing tools must fail (CI, as localserver.RequireServers
// says).
package headless

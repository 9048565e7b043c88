package rollout

import "errors"

// ErrSecondary wraps every failure of the secondary backend in mirror and
// shadow modes. Such failures never change a decision; they are counted in
// Stats and passed to the secondary error handler. Bad options wrap
// driver.ErrInvalidOption, and a Backend not built by New returns errors
// wrapping driver.ErrNotInitialized, as in every package of the module.
var ErrSecondary = errors.New("throttlekit: rollout: secondary backend failure")

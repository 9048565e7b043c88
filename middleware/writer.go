package middleware

import (
	"bufio"
	"io"
	"net"
	"net/http"
)

// statusWriter records the final status a handler answers with, so that the
// Limiter can refund after the handler has finished. It keeps every
// capability of the writer it wraps: Flush and Hijack are passed through
// http.ResponseController, and Unwrap lets a ResponseController reach the
// rest (deadlines, full duplex).
type statusWriter struct {
	http.ResponseWriter
	status   int
	hijacked bool
}

var (
	_ http.Flusher                              = (*statusWriter)(nil)
	_ http.Hijacker                             = (*statusWriter)(nil)
	_ io.ReaderFrom                             = (*statusWriter)(nil)
	_ interface{ Unwrap() http.ResponseWriter } = (*statusWriter)(nil)
)

// WriteHeader records the first final status: informational 1xx responses
// other than 101 Switching Protocols come before the real one.
func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && (code >= 200 || code == http.StatusSwitchingProtocols) {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	w.implicitOK()
	return w.ResponseWriter.Write(b)
}

// ReadFrom keeps the wrapped writer's sendfile path for io.Copy.
func (w *statusWriter) ReadFrom(src io.Reader) (int64, error) {
	w.implicitOK()
	if rf, ok := w.ResponseWriter.(io.ReaderFrom); ok {
		return rf.ReadFrom(src)
	}
	return io.Copy(writerOnly{w.ResponseWriter}, src)
}

// Flush implements http.Flusher; FlushError is what a ResponseController
// calls, so that it sees the error.
func (w *statusWriter) Flush() { _ = w.FlushError() }

// FlushError flushes the wrapped writer and reports why it could not.
func (w *statusWriter) FlushError() error {
	w.implicitOK()
	return http.NewResponseController(w.ResponseWriter).Flush()
}

// Hijack implements http.Hijacker. It fails with http.ErrNotSupported where
// the wrapped writer cannot hijack (HTTP/2). A hijacked request is never
// refunded: its status is unknown.
func (w *statusWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	conn, rw, err := http.NewResponseController(w.ResponseWriter).Hijack()
	if err == nil {
		w.hijacked = true
	}
	return conn, rw, err
}

// Unwrap returns the wrapped writer, for http.ResponseController.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// implicitOK records the 200 that net/http sends when a handler writes or
// flushes before calling WriteHeader.
func (w *statusWriter) implicitOK() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
}

// finalStatus is the status the client got: 200 when the handler wrote
// nothing at all, 0 when it hijacked the connection.
func (w *statusWriter) finalStatus() int {
	if w.hijacked {
		return 0
	}
	if w.status == 0 {
		return http.StatusOK
	}
	return w.status
}

// writerOnly hides every method but Write, so io.Copy cannot loop back into
// ReadFrom.
type writerOnly struct{ io.Writer }

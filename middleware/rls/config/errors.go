package config

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// ErrInvalidConfig is wrapped by every error about a configuration's
// contents: errors.Is(err, ErrInvalidConfig) tells a bad file from a
// directory that could not be read.
var ErrInvalidConfig = errors.New("throttlekit/rls: invalid configuration")

// Error locates a configuration error. Line and Column are 1-based, and 0
// when unknown (a file too large, a YAML error without a position). Every
// *Error wraps ErrInvalidConfig.
type Error struct {
	// File is the name of the configuration file, as given to Parse or as
	// LoadDir found it.
	File string
	// Line and Column point at the offending node, 0 when unknown.
	Line, Column int
	// Msg says what is wrong, without the position.
	Msg string
}

// Error returns "FILE:LINE:COL: MSG", "FILE:LINE: MSG" when the column is
// unknown, or "FILE: MSG" when the line is.
func (e *Error) Error() string {
	switch {
	case e.Line > 0 && e.Column > 0:
		return e.File + ":" + strconv.Itoa(e.Line) + ":" + strconv.Itoa(e.Column) + ": " + e.Msg
	case e.Line > 0:
		return e.File + ":" + strconv.Itoa(e.Line) + ": " + e.Msg
	default:
		return e.File + ": " + e.Msg
	}
}

// Unwrap returns ErrInvalidConfig.
func (e *Error) Unwrap() error { return ErrInvalidConfig }

// yamlLine matches the position yaml.v3 puts at the start of its syntax
// errors.
var yamlLine = regexp.MustCompile(`^yaml: line (\d+): `)

// syntaxError turns an error of the YAML parser into an *Error, taking the
// line out of its message when it has one.
func syntaxError(file string, err error) *Error {
	msg := err.Error()
	line := 0
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		if n, convErr := strconv.Atoi(m[1]); convErr == nil {
			line = n
		}
		msg = msg[len(m[0]):]
	} else {
		msg = strings.TrimPrefix(msg, "yaml: ")
	}
	for _, p := range parserProblems {
		if strings.HasPrefix(msg, p) {
			// yaml.v3 gives the 0-based line of the enclosing collection
			// (or of the problem) for these, and no line for the first.
			line++
			break
		}
	}
	return &Error{File: file, Line: line, Msg: "YAML syntax error: " + msg}
}

// parserProblems are the messages of the errors yaml.v3's parser (rather
// than its scanner) reports, whose line it gives 0-based.
var parserProblems = []string{
	"did not find expected <stream-start>",
	"did not find expected <document start>",
	"found duplicate %YAML directive",
	"found incompatible YAML document",
	"found duplicate %TAG directive",
	"found undefined tag handle",
	"did not find expected node content",
	"did not find expected '-' indicator",
	"did not find expected key",
	"did not find expected ',' or ']'",
	"did not find expected ',' or '}'",
}

// errorf returns an *Error for file at the position of n (0:0 for nil).
func errorf(file string, n position, format string, args ...any) *Error {
	return &Error{File: file, Line: n.line, Column: n.column, Msg: fmt.Sprintf(format, args...)}
}

// position is a 1-based line and column, zero when unknown.
type position struct{ line, column int }

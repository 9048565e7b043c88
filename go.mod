module github.com/throttlekit/throttlekit

go 1.24

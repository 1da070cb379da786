// Command webserver stands in for nginx and httpd in critest's images: it
// answers every GET with a page on -port, writes its pid to -pid, and
// logs a line naming itself (its file's base name) on stdout. Arguments
// after the flags only show in its command line, where critest looks for
// nginx's "master process".
package main

import (
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
)

func main() {
	port := flag.Int("port", 80, "TCP port to serve on")
	pidFile := flag.String("pid", "", "file to write the pid to")
	flag.Parse()
	name := filepath.Base(os.Args[0])
	if *pidFile != "" {
		if err := os.WriteFile(*pidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
			log.Fatal(err)
		}
	}
	// As a container's pid 1 it gets no default action for SIGTERM.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		os.Exit(0)
	}()
	http.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "<html><body>"+name+"</body></html>\n")
	})
	fmt.Printf("%s: serving on port %d\n", name, *port)
	log.Fatal(http.ListenAndServe(":"+strconv.Itoa(*port), nil))
}

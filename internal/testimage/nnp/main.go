// Command nnp prints its effective uid; installed setuid root in critest's
// nonewprivs image, it shows whether no_new_privs kept the setuid bit from
// taking effect.
package main

import (
	"fmt"
	"os"
)

func main() {
	fmt.Printf("Effective uid: %d\n", os.Geteuid())
}

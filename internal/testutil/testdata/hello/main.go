// Command hello is what testutil's own tests build with BuildBinary.
package main

import "fmt"

func main() { fmt.Println("hello from a cached test binary") }

# A template with typed parameters and a preset, shared by the tests of kloud
# (kloud/params_test.go), its CLI (kloud/cli/params_test.go) and the web UI
# (e2e/params_test.go). The machine's triggers_replace shows what terraform was given.
variable "size" {
  type        = string
  description = "How big the machine is"
  default     = "small"
}

variable "cpus" {
  type    = number
  default = 1
  validation {
    condition     = var.cpus >= 1 && var.cpus <= 4
    error_message = "A machine has 1 to 4 CPUs."
  }
}

variable "tags" {
  type    = list(string)
  default = []
}

variable "api_key" {
  type      = string
  sensitive = true
}

kloud_parameter "size" {
  display_name = "Machine size"
  choices      = ["small", "large"]
  mutable      = false
  order        = 1
}

kloud_preset "big" {
  default = true
  values  = { size = "large", cpus = 4 }
}

resource "terraform_data" "vm" {
  input            = "#!/bin/bash\necho up"
  triggers_replace = { size = var.size, cpus = var.cpus, tags = var.tags }
}

terraform {
  required_version = ">= 1.5"
}

variable "size" {
  type    = number
  default = 3
}

resource "terraform_data" "web" {
  count = 2
  input = {
    user_data = <<-EOT
      #!/bin/sh
      echo web
    EOT
    size      = var.size # an expression next to the user data
  }
}

resource "terraform_data" "db" {
  input = { size = 1, user_data = "echo db" }
}

resource "terraform_data" "worker" {
  # no user data key yet
  input = {
    size = 2
  }
}

resource "terraform_data" "cache" {
}

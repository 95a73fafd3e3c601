# terraform_data resources stand in for machines: kloud sets their input to the machine's
# cloud-init, as it would set an instance's user_data.
terraform {
  required_version = ">= 1.5"
}

resource "terraform_data" "web" {
  count = 2

  # the user's script, in a heredoc
  input = <<-EOT
    #!/bin/sh
    echo "web on $${HOSTNAME}"
  EOT

  lifecycle {
    create_before_destroy = true
  }
}

resource "terraform_data" "db" {
  input = "echo db" # quoted
}

resource "terraform_data" "cache" {}

resource "terraform_data" "tiny" { triggers_replace = ["a"] }

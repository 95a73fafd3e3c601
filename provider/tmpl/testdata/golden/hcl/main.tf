# A stack template in HCL native syntax.
terraform {
  required_version = ">= 1.5"
  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.0"
    }
  }
}

provider "aws" {
  access_key = var.aws_access_key # secrets are fine here
  secret_key = var.aws_secret_key
  region     = "us-east-1"
}

variable "aws_access_key" {
  sensitive = true
}

variable "instance_type" {
  type    = string
  default = "t3.micro"
}

# web: two machines sharing one script.
resource "aws_instance" "web" {
  count         = 2
  ami           = "ami-0123456789"
  instance_type = var.instance_type
  monitoring    = true
  cpu_credits   = -1

  # user script, kept in a heredoc
  user_data = var.kloud_user_data_web[count.index]

  root_block_device {
    volume_size = 20 # GiB
  }

  tags = {
    Name = "web-${count.index}"
  }
}

resource "aws_instance" "db" {
  ami           = "ami-0123456789"
  instance_type = "t3.small" # keep small
  user_data     = var.kloud_user_data_db
}

resource "aws_instance" "worker" {
  ami       = "ami-0123456789"
  user_data = var.kloud_user_data_worker # an expression: not literal
}

resource "aws_instance" "bare" {
  user_data = var.kloud_user_data_bare
}

resource "aws_instance" "oneline" {
  ami = "ami-1"
  user_data = var.kloud_user_data_oneline
}

resource "aws_eip" "web" {
  count    = 2
  instance = aws_instance.web[count.index].id
}

data "aws_region" "current" {}

output "web_ips" {
  value = aws_instance.web[*].public_ip
}

provider "aws" {
  access_key = var.aws_access_key
  secret_key = var.aws_secret_key
  assume_role {
    external_id = var.aws_secret_key # nested blocks of a provider are fine
  }
}

provider "aws" {
  alias      = "west"
  secret_key = var.aws_secret_key
}

resource "aws_instance" "web" {
  user_data = "echo $${var.aws_secret_key}" # escaped: a literal, not a reference
  tags = {
    for var in ["aws_secret_key"] : var => var # an iterator named var
  }
  ami = var.aws_secret_key_id # another variable
}

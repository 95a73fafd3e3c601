resource "aws_instance" "web" {
  ami       = "ami-1"
  user_data = var.aws_secret_key
}

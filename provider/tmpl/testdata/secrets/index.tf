resource "aws_instance" "web" {
  user_data = var["aws_secret_key"]
}

resource "aws_instance" "web" {
  root_block_device {
    volume_size = 8
    tags = { k = var.aws_secret_key }
  }
}

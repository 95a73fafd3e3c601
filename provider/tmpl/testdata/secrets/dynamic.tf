resource "aws_instance" "web" {
  dynamic "ebs_block_device" {
    for_each = var.aws_secret_key == "" ? [] : [1]
    content {
      device_name = var.aws_access_key
    }
  }
}

output "web_ids" {
  value = terraform_data.web[*].id
}

// Package s3client makes aws-sdk-go-v2 S3 clients for kloud's object buckets: path-style
// requests to one endpoint with static keys, no shared AWS configuration read from the
// environment or from ~/.aws. objstore/seaweed uses it with the admin key, objstore/bucketcheck
// with the keys a provisioner hands out. Start at New.
package s3client

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/kloud-dev/kloud/provider/ptype"
)

// New returns a client of the S3 server at endpoint (http://host:port) signing with the key
// (accessKey, secretKey) for region ("" is "us-east-1"). Checksums are computed and checked
// only where S3 requires them (the servers kloud uses do not all speak the newer ones).
func New(endpoint, region, accessKey, secretKey string) *s3.Client {
	if region == "" {
		region = "us-east-1"
	}
	return s3.New(s3.Options{
		Region:                     region,
		BaseEndpoint:               aws.String(endpoint),
		UsePathStyle:               true,
		Credentials:                credentials.NewStaticCredentialsProvider(accessKey, secretKey, ""),
		HTTPClient:                 &http.Client{Timeout: 10 * time.Minute},
		RequestChecksumCalculation: aws.RequestChecksumCalculationWhenRequired,
		ResponseChecksumValidation: aws.ResponseChecksumValidationWhenRequired,
	})
}

// ForKey returns a client of b's endpoint signing with k.
func ForKey(b ptype.Bucket, k ptype.BucketKey) *s3.Client {
	return New(b.Endpoint, b.Region, k.AccessKey, k.SecretKey)
}

// Put writes body as bucket/key.
func Put(ctx context.Context, c *s3.Client, bucket, key, body string) error {
	_, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: strings.NewReader(body)})
	return err
}

// Get reads bucket/key whole.
func Get(ctx context.Context, c *s3.Client, bucket, key string) (string, error) {
	out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	if err != nil {
		return "", err
	}
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	return string(b), err
}

// ErrorCode is err's S3 error code, e.g. "AccessDenied" ("" for none).
func ErrorCode(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// HTTPStatus is the HTTP status of a failed S3 call (0 for none).
func HTTPStatus(err error) int {
	var re interface{ HTTPStatusCode() int }
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}
